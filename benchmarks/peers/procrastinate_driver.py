"""procrastinate's side of the benchmark (runs in its own venv; async psycopg connector).

    python -m benchmarks.peers.procrastinate_driver DSN setup
    python -m benchmarks.peers.procrastinate_driver DSN enqueue N
    python -m benchmarks.peers.procrastinate_driver DSN work CONCURRENCY SLEEP_MS [drain|continuous]
    python -m benchmarks.peers.procrastinate_driver DSN latency-enqueue COUNT INTERVAL OUT

Tasks are ``async def`` so that ``concurrency`` applies (procrastinate's docs: do not
use concurrency with blocking synchronous tasks). ``drain`` is ``wait=False``.
With ``BENCH_LATENCY_FILE`` set, the task records when it starts.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import procrastinate

from benchmarks.peers.common import emit, open_loop_async

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=sys.argv[1]))
_delay = 0.0
_out = None


@app.task(name="bench", pass_context=True)
async def bench(context: procrastinate.JobContext) -> None:
    if _out is not None:
        _out.write(f"{context.job.id} {time.time():.6f}\n")
    if _delay:
        await asyncio.sleep(_delay)


async def main(command: str, args: list[str]) -> None:
    global _delay, _out
    async with app.open_async():
        if command == "setup":
            await app.schema_manager.apply_schema_async()
            emit({})
        elif command == "enqueue":
            n = int(args[0])
            started = time.perf_counter()
            await bench.batch_defer_async(*({} for _ in range(n)))
            emit({"jobs": n, "seconds": time.perf_counter() - started})
        elif command == "latency-enqueue":
            count, interval, out = int(args[0]), float(args[1]), args[2]
            await open_loop_async(bench.defer_async, count, interval, out)
            emit({"jobs": count})
        elif command == "work":
            concurrency, _delay = int(args[0]), float(args[1]) / 1000
            drain = (args[2] if len(args) > 2 else "drain") == "drain"
            latency_file = os.environ.get("BENCH_LATENCY_FILE")
            if latency_file:
                _out = open(latency_file, "a", buffering=1)  # noqa: SIM115
            await app.run_worker_async(concurrency=concurrency, wait=not drain)
        else:
            raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[2], sys.argv[3:]))
