"""Consumer throughput: how fast does one consumer follow the head?

    DJANGO_SETTINGS_MODULE=benchmarks.benchproject.settings \\
        python -m benchmarks.consumers [--events 200000] [--batch-sizes 100,1000] [--reps 3]

For each batch size and repetition: ``BenchEvent`` is emptied and ``--events`` rows
are inserted (``INSERT … SELECT generate_series``, one transaction: no gaps), then
``VACUUM ANALYZE``; the checkpoint row of ``TrivialConsumer`` (a ``handle_batch``
that does nothing) is reset to 0 and assigned to this process, and the worker's own
batch loop (``consumers.batch.Batches``, transactional mode: guard, window,
frontier, ``handle_batch``, checkpoint, one transaction per batch) runs until the
checkpoint reaches the head. Events per second of that loop. Prints JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
from django_dbworker.consumers.batch import Batches, Fence  # noqa: E402
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch-sizes", default="100,1000")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
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
    emit({"events": args.events, "reps": args.reps, "batch_sizes": sizes})


if __name__ == "__main__":
    main()
