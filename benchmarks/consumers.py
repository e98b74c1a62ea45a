"""Consumer throughput: how fast does one consumer follow the head?

    DJANGO_SETTINGS_MODULE=benchmarks.benchproject.settings \\
        python -m benchmarks.consumers [--events 200000] [--batch-sizes 100,1000] [--reps 3]
            [--loop batches|worker]
            [--live-rate 50000 --live-seconds 15 --live-batch-size 100]

For each batch size and repetition: ``BenchEvent`` is emptied and ``--events`` rows
are inserted (``INSERT … SELECT generate_series``, one transaction: no gaps), then
``VACUUM ANALYZE``; the checkpoint row of ``TrivialConsumer`` (a ``handle_batch``
that does nothing) is reset to 0 and assigned to this process, and the worker's own
batch loop (``consumers.batch.Batches``, transactional mode: guard, window,
frontier, ``handle_batch``, checkpoint, one transaction per batch) runs until the
checkpoint reaches the head. Events per second of that loop.

``--loop worker`` runs the worker's consumer thread instead (``consumers.runner.
ConsumerThread``: the batches plus what a worker does between them: the connection's
upkeep, the idle back-off), under the settings' ``CONN_MAX_AGE`` (the benchmark
project leaves Django's default, 0), and also counts the database connections that
thread opened.

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

import threading  # noqa: E402

from django.db import connection  # noqa: E402
from django.db.backends.signals import connection_created  # noqa: E402

from benchmarks.benchproject.consumers import TrivialConsumer  # noqa: E402
from benchmarks.benchproject.models import BenchEvent  # noqa: E402
from benchmarks.peers.common import emit  # noqa: E402
from django_dbworker.consumers.assignment import ensure_rows  # noqa: E402
from django_dbworker.consumers.batch import Batches, Fence, head_of  # noqa: E402
from django_dbworker.consumers.runner import ConsumerThread  # noqa: E402
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


def fresh(name: str, batch_size: int) -> TrivialConsumer:
    """The trivial consumer at ``batch_size``, its checkpoint at 0 and ours."""
    consumer = type(name, (TrivialConsumer,), {"batch_size": batch_size})()
    ensure_rows("default", [consumer])
    ConsumerCheckpoint.objects.filter(name=consumer.name).update(
        position=0, head=0, owner=WORKER, running_by=WORKER, generation=1, paused=False
    )
    return consumer


def follow(events: int, batch_size: int) -> float:
    """Seconds the batch loop takes from position 0 to the head ``events``."""
    consumer = fresh("Trivial", batch_size)
    batches = Batches(consumer, Fence(consumer.name, WORKER, 1), 5.0)
    started = time.perf_counter()
    position = 0
    while position < events:
        result = batches.run_once()
        position += result.advanced
        if not result.advanced:
            raise RuntimeError(f"the consumer stopped at {position} of {events}")
    return time.perf_counter() - started


def follow_in_worker(events: int, batch_size: int) -> tuple[float, int]:
    """Seconds the worker's consumer thread takes from position 0 to the head
    ``events``, and the connections it opened."""
    consumer = fresh("Trivial", batch_size)
    opened = []

    def note(sender: object, **kwargs: object) -> None:
        if threading.current_thread().name.startswith("dbworker-consumer-"):
            opened.append(1)

    connection_created.connect(note)
    thread = ConsumerThread(consumer, Fence(consumer.name, WORKER, 1), 5.0)
    started = time.perf_counter()
    thread.start()
    checkpoint = ConsumerCheckpoint.objects.filter(name=consumer.name)
    while checkpoint.values_list("position", flat=True).get() < events:
        if not thread.is_alive():
            raise RuntimeError("the consumer thread stopped")
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    thread.stop()
    thread.join(30)
    connection_created.disconnect(note)
    return elapsed, len(opened)


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
    consumer = fresh("Live", batch_size)
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
    p.add_argument(
        "--loop",
        choices=["batches", "worker"],
        default="batches",
        help="the batch loop alone, or the worker's consumer thread (default: %(default)s)",
    )
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
        rates, connections = [], []
        for _ in range(args.reps):
            fill(args.events)
            if args.loop == "worker":
                seconds, opened = follow_in_worker(args.events, size)
                connections.append(opened)
            else:
                seconds = follow(args.events, size)
            rates.append(args.events / seconds)
        sizes[str(size)] = {
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "runs": rates,
            **({"connections_opened": connections} if connections else {}),
        }
    result: dict[str, Any] = {
        "events": args.events,
        "reps": args.reps,
        "loop": args.loop,
        "conn_max_age": connection.settings_dict["CONN_MAX_AGE"],
        "batch_sizes": sizes,
    }
    if args.live_rate:
        result["live"] = follow_live(args.live_rate, args.live_seconds, args.live_batch_size)
    emit(result)


if __name__ == "__main__":
    main()
