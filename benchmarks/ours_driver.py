"""django_dbworker's side of the benchmark, run by the harness as a subprocess.

    python -m benchmarks.ours_driver setup
    python -m benchmarks.ours_driver enqueue N
    python -m benchmarks.ours_driver latency-enqueue COUNT INTERVAL OUT
    python -m benchmarks.ours_driver latency-enqueue-sql COUNT INTERVAL OUT
    python -m benchmarks.ours_driver enqueue-tasks N VARIANT
    python -m benchmarks.ours_driver enqueue-timing COUNT

``enqueue-tasks``: a backlog of ``django.tasks`` tasks through ``task.enqueue()``
(in one transaction). ``enqueue-timing``: ``enqueue()`` of one task as a web request
does it (autocommit), COUNT times: queries per call and the time of each call.

Enqueueing goes through the documented API: ``BenchJob.objects.bulk_enqueue`` of
mappings of field values for the backlog, ``BenchJob.objects.create`` (autocommit)
for single jobs.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from benchmarks.benchproject import tasks  # noqa: E402
from benchmarks.benchproject.models import BenchJob  # noqa: E402
from benchmarks.peers.common import emit, open_loop  # noqa: E402


def main(argv: list[str]) -> None:
    command = argv[0]
    if command == "setup":
        call_command("migrate", verbosity=0)
        if connection.vendor == "postgresql":  # MariaDB: a new database, tables empty
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {BenchJob._meta.db_table} RESTART IDENTITY CASCADE")
                cursor.execute("TRUNCATE dbworker_tasks_taskjob RESTART IDENTITY")
        emit({"table": BenchJob._meta.db_table})
    elif command == "reset":
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {BenchJob._meta.db_table} RESTART IDENTITY CASCADE")
            cursor.execute("TRUNCATE dbworker_tasks_taskjob RESTART IDENTITY")
        emit({})
    elif command == "enqueue":
        n = int(argv[1])
        started = time.perf_counter()
        BenchJob.objects.bulk_enqueue({"tenant": i % 100} for i in range(n))
        elapsed = time.perf_counter() - started
        emit({"jobs": n, "seconds": elapsed})
    elif command == "latency-enqueue":
        count, interval, out = int(argv[1]), float(argv[2]), argv[3]
        open_loop(lambda: BenchJob.objects.create().pk, count, interval, out)
        emit({"jobs": count})
    elif command == "latency-enqueue-sql":
        # What another service does: a plain INSERT, no notify_workers() call.
        count, interval, out = int(argv[1]), float(argv[2]), argv[3]
        insert = f"INSERT INTO {BenchJob._meta.db_table} DEFAULT VALUES RETURNING id"

        def plain_insert() -> int:
            with connection.cursor() as cursor:
                cursor.execute(insert)
                return int(cursor.fetchone()[0])

        open_loop(plain_insert, count, interval, out)
        emit({"jobs": count})
    elif command == "enqueue-tasks":
        n, variant = int(argv[1]), argv[2]
        the_task = {"noop": tasks.noop, "sleep1ms": tasks.sleep_1ms}[variant]
        started = time.perf_counter()
        with transaction.atomic():
            for _ in range(n):
                the_task.enqueue()
        emit({"jobs": n, "seconds": time.perf_counter() - started})
    elif command == "enqueue-timing":
        emit(enqueue_timing(int(argv[1])))
    else:
        raise SystemExit(f"unknown command {command!r}")


def enqueue_timing(count: int) -> dict[str, float]:
    """``noop.enqueue()`` in autocommit, as a view does: queries of one call, and the
    p50/p95 of ``count`` calls (after a warm-up)."""
    from django.test.utils import CaptureQueriesContext

    for _ in range(50):
        tasks.noop.enqueue()
    with CaptureQueriesContext(connection) as queries:
        tasks.noop.enqueue()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        tasks.noop.enqueue()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {
        "queries_per_enqueue": len(queries.captured_queries),
        "statements": [q["sql"][:60] for q in queries.captured_queries],
        "p50_ms": times[len(times) // 2],
        "p95_ms": times[int(len(times) * 0.95)],
        "calls": count,
    }


if __name__ == "__main__":
    main(sys.argv[1:])
