"""Consumer throughput: how fast does one consumer follow the head?

    DJANGO_SETTINGS_MODULE=benchmarks.benchproject.settings \\
        python -m benchmarks.consumers [--events 200000] [--batch-sizes 100,1000] [--reps 3]
            [--live-rate 50000 --live-seconds 15 --live-batch-size 100]

For each batch size and repetition: ``BenchEvent`` is emptied and ``--events`` rows
are inserted (``INSERT … SELECT generate_series``, one transaction: no gaps), then
``VACUUM ANALYZE``; the checkpoint row of ``TrivialConsumer`` (a ``handle_batch``
that does nothing) is reset to 0 and assigned to this process, and the worker's own
batch loop (``consumers.batch.Batches``, transactional mode: guard, window,
frontier, ``handle_batch``, checkpoint, one transaction per batch) runs until the
checkpoint reaches the head. Events per second of that loop.

``--live-rate R`` (0: off) also measures following a live writer: a writer process
inserts R events/s (a committed multi-row INSERT every 10 ms) for ``--live-seconds``
while the same loop follows from the start (sleeping 2 ms when a batch found nothing,
where a worker would wait for the insert's NOTIFY); it reports the rates written and
consumed, the lag in rows sampled every 100 ms, and how long after the writer's last
commit the consumer reached the head. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.db import connection  # noqa: E402

from benchmarks.benchproject.consumers import TrivialConsumer  # noqa: E402
from benchmarks.benchproject.models import BenchEvent  # noqa: E402
from benchmarks.peers.common import emit  # noqa: E402
from django_dbworker.consumers.assignment import ensure_rows  # noqa: E402
from django_dbworker.consumers.batch import Batches, Fence, head_of  # noqa: E402
from django_dbworker.models import ConsumerCheckpoint  # noqa: E402

TABLE = BenchEvent._meta.db_table
WORKER = "bench:consumers"


def fill(events: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY")
        cursor.execute(
            f"INSERT INTO {TABLE} (kind, payload) "
            "SELECT 'Order', jsonb_build_object('n', g) FROM generate_series(1, %s) g",
            [events],
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


def follow(events: int, batch_size: int) -> float:
    """Seconds the batch loop takes from position 0 to the head ``events``."""
    consumer = type("Trivial", (TrivialConsumer,), {"batch_size": batch_size})()
    ensure_rows("default", [(consumer.name, 0)])
    ConsumerCheckpoint.objects.filter(name=consumer.name).update(
        position=0, head=0, owner=WORKER, running_by=WORKER, generation=1, paused=False
    )
    batches = Batches(consumer, Fence(consumer.name, WORKER, 1), 5.0)
    started = time.perf_counter()
    position = 0
    while position < events:
        result = batches.run_once()
        position += result.advanced
        if not result.advanced:
            raise RuntimeError(f"the consumer stopped at {position} of {events}")
    return time.perf_counter() - started


def write(rate: int, seconds: float) -> None:
    """The live writer: ``rate`` events/s in chunks every 10 ms, one transaction each."""
    chunk = max(rate // 100, 1)
    written, started = 0, time.monotonic()
    with connection.cursor() as cursor:
        while time.monotonic() - started < seconds:
            cursor.execute(
                f"INSERT INTO {TABLE} (kind, payload) "
                "SELECT 'Order', jsonb_build_object('n', g) FROM generate_series(1, %s) g",
                [chunk],
            )
            written += chunk
            time.sleep(max(written / rate - (time.monotonic() - started), 0.0))
    emit({"written": written, "seconds": time.monotonic() - started})


def follow_live(rate: int, seconds: float, batch_size: int) -> dict[str, Any]:
    fill(0)
    consumer = type("Live", (TrivialConsumer,), {"batch_size": batch_size})()
    ensure_rows("default", [(consumer.name, 0)])
    ConsumerCheckpoint.objects.filter(name=consumer.name).update(
        position=0, head=0, owner=WORKER, running_by=WORKER, generation=1, paused=False
    )
    batches = Batches(consumer, Fence(consumer.name, WORKER, 1), 5.0)
    writer = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.consumers", "--write", str(rate), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    position, lags, next_sample = 0, [], started
    finished_writing = None
    while True:
        now = time.monotonic()
        if finished_writing is None and writer.poll() is not None:
            finished_writing = now
        if now >= next_sample:
            lags.append(head_of(consumer) - position)
            next_sample = now + 0.1
        result = batches.run_once()
        position += result.advanced
        if not result.advanced:
            if finished_writing is not None and head_of(consumer) == position:
                break
            if now - started > seconds * 4 + 60:
                raise RuntimeError(f"the consumer stopped at {position}")
            time.sleep(0.002)
    done = time.monotonic()
    out, _ = writer.communicate()
    wrote = json.loads(out.splitlines()[-1])
    assert finished_writing is not None
    lags.sort()
    return {
        "rate_target": rate,
        "batch_size": batch_size,
        "written_per_s": wrote["written"] / wrote["seconds"],
        "consumed_per_s": position / (done - started),
        "events": position,
        "lag_rows": {
            "p50": lags[len(lags) // 2],
            "p99": lags[int(len(lags) * 0.99)],
            "max": lags[-1],
        },
        "at_head_after_writer_s": done - finished_writing,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch-sizes", default="100,1000")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--live-rate", type=int, default=0)
    p.add_argument("--live-seconds", type=float, default=15.0)
    p.add_argument("--live-batch-size", type=int, default=100)
    p.add_argument("--write", nargs=2, metavar=("RATE", "SECONDS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.write:
        write(int(args.write[0]), float(args.write[1]))
        return
    sizes: dict[str, Any] = {}
    for size in [int(x) for x in args.batch_sizes.split(",") if x]:
        rates = []
        for _ in range(args.reps):
            fill(args.events)
            rates.append(args.events / follow(args.events, size))
        sizes[str(size)] = {
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "runs": rates,
        }
    result: dict[str, Any] = {"events": args.events, "reps": args.reps, "batch_sizes": sizes}
    if args.live_rate:
        result["live"] = follow_live(args.live_rate, args.live_seconds, args.live_batch_size)
    emit(result)


if __name__ == "__main__":
    main()
