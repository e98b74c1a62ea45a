"""Where ``bulk_enqueue``'s time goes: the caller's model instances, our part, COPY.

    python -m benchmarks.enqueue_cost [--jobs N] [--reps R]

On the benchmark project's table (``BENCH_DATABASE_URL``, default the harness's
``dbworker_bench``; migrated, then emptied before each measure), R times each:

- ``init``: building N ``BenchJob(tenant=…)`` instances, and N ``BenchJob()``
  (Django's ``Model.__init__``: what the caller pays before ``bulk_enqueue`` runs);
- ``bulk_enqueue``: of instances built as it goes, with and without the keyword
  argument; of mappings (``{"tenant": …}``, what the harness measures); and of
  instances built beforehand (our part and the server's);
- ``copy``: a plain psycopg ``COPY`` of the same two columns (the floor).

Prints the median rate of each (jobs/s) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from benchmarks.benchproject.models import BenchJob  # noqa: E402

TABLE = BenchJob._meta.db_table


def empty() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")


def rate(n: int, reps: int, run: Callable[[], object], reset: bool = True) -> float:
    rates = []
    for _ in range(reps):
        if reset:
            empty()
        started = time.perf_counter()
        run()
        rates.append(n / (time.perf_counter() - started))
    return statistics.median(rates)


def copy(n: int) -> None:
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {TABLE} (tenant, process_after) FROM STDIN") as out,
    ):
        for i in range(n):
            out.write_row((i % 100, None))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.enqueue_cost")
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--reps", type=int, default=3)
    options = parser.parse_args()
    n, reps = options.jobs, options.reps
    call_command("migrate", verbosity=0)
    built: list[BenchJob] = []

    def build() -> None:
        built[:] = [BenchJob(tenant=i % 100) for i in range(n)]

    def enqueue_built() -> None:
        build()
        empty()
        started = time.perf_counter()
        BenchJob.objects.bulk_enqueue(built)
        prebuilt.append(n / (time.perf_counter() - started))

    prebuilt: list[float] = []
    for _ in range(reps):
        enqueue_built()
    result = {
        "jobs": n,
        "init_with_kwarg": rate(n, reps, build, reset=False),
        "init_without": rate(n, reps, lambda: [BenchJob() for _ in range(n)], reset=False),
        "bulk_enqueue_with_kwarg": rate(
            n,
            reps,
            lambda: BenchJob.objects.bulk_enqueue(BenchJob(tenant=i % 100) for i in range(n)),
        ),
        "bulk_enqueue_without": rate(
            n, reps, lambda: BenchJob.objects.bulk_enqueue(BenchJob() for _ in range(n))
        ),
        "bulk_enqueue_mappings": rate(
            n, reps, lambda: BenchJob.objects.bulk_enqueue({"tenant": i % 100} for i in range(n))
        ),
        "bulk_enqueue_prebuilt": statistics.median(prebuilt),
        "copy": rate(n, reps, lambda: copy(n)),
    }
    empty()
    print(json.dumps({k: round(v) for k, v in result.items()}, indent=2))


if __name__ == "__main__":
    main()
