"""django_dbworker's side of the benchmark, run by the harness as a subprocess.

    python -m benchmarks.ours_driver setup
    python -m benchmarks.ours_driver enqueue N
    python -m benchmarks.ours_driver latency-enqueue COUNT INTERVAL OUT

Enqueueing goes through the documented API: ``BenchJob.objects.bulk_enqueue`` for
the backlog, ``BenchJob.objects.create`` (autocommit) for single jobs.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from benchmarks.benchproject.models import BenchJob  # noqa: E402
from benchmarks.peers.common import emit, open_loop  # noqa: E402


def main(argv: list[str]) -> None:
    command = argv[0]
    if command == "setup":
        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {BenchJob._meta.db_table} RESTART IDENTITY")
        emit({"table": BenchJob._meta.db_table})
    elif command == "reset":
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {BenchJob._meta.db_table} RESTART IDENTITY")
        emit({})
    elif command == "enqueue":
        n = int(argv[1])
        started = time.perf_counter()
        BenchJob.objects.bulk_enqueue(BenchJob() for _ in range(n))
        elapsed = time.perf_counter() - started
        emit({"jobs": n, "seconds": elapsed})
    elif command == "latency-enqueue":
        count, interval, out = int(argv[1]), float(argv[2]), argv[3]
        open_loop(lambda: BenchJob.objects.create().pk, count, interval, out)
        emit({"jobs": count})
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
