"""pgqueuer's side of the benchmark (runs in its own venv; asyncpg driver, as its docs).

    python -m benchmarks.peers.pgqueuer_driver DSN setup
    python -m benchmarks.peers.pgqueuer_driver DSN enqueue N
    python -m benchmarks.peers.pgqueuer_driver DSN work BATCH_SIZE SLEEP_MS [drain|continuous]
    python -m benchmarks.peers.pgqueuer_driver DSN latency-enqueue COUNT INTERVAL OUT

``work`` runs one ``PgQueuer`` in this process on one asyncpg connection, with
uvloop as pgqueuer's own CLI does; ``drain`` exits once the queue is empty.
With ``BENCH_LATENCY_FILE`` set, the handler records when it starts.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import asyncpg
from pgqueuer import AsyncpgDriver, Job, PgQueuer, Queries, types

from benchmarks.peers.common import emit, open_loop_async

ENTRYPOINT = "bench"


async def main(dsn: str, command: str, args: list[str]) -> None:
    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    if command == "setup":
        await queries.install()
        emit({})
    elif command == "enqueue":
        n = int(args[0])
        started = time.perf_counter()
        await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
        emit({"jobs": n, "seconds": time.perf_counter() - started})
    elif command == "latency-enqueue":
        count, interval, out = int(args[0]), float(args[1]), args[2]

        async def one() -> int:
            (job_id,) = await queries.enqueue(ENTRYPOINT, None)
            return int(job_id)

        await open_loop_async(one, count, interval, out)
        emit({"jobs": count})
    elif command == "work":
        await work(conn, int(args[0]), float(args[1]), args[2] if len(args) > 2 else "drain")
    else:
        raise SystemExit(f"unknown command {command!r}")


async def work(conn: asyncpg.Connection, batch_size: int, sleep_ms: float, mode: str) -> None:
    pgq = PgQueuer(AsyncpgDriver(conn))
    latency_file = os.environ.get("BENCH_LATENCY_FILE")
    out = open(latency_file, "a", buffering=1) if latency_file else None  # noqa: SIM115
    delay = sleep_ms / 1000

    @pgq.entrypoint(ENTRYPOINT)
    async def bench(job: Job) -> None:
        if out is not None:
            out.write(f"{job.id} {time.time():.6f}\n")
        if delay:
            await asyncio.sleep(delay)

    await pgq.run(batch_size=batch_size, mode=types.QueueExecutionMode(mode))


if __name__ == "__main__":
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover
        run = asyncio.run
    run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
