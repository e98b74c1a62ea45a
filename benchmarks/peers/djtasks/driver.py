"""django-tasks-db's side of the benchmark (runs in its own venv with Django 6).

    python -m benchmarks.peers.djtasks.driver setup
    python -m benchmarks.peers.djtasks.driver enqueue N SLEEP_MS
    python -m benchmarks.peers.djtasks.driver latency-enqueue COUNT INTERVAL OUT

The worker is its own command: ``python -m django db_worker --batch``. Django Tasks
has no bulk enqueue: the backlog is ``task.enqueue()`` per job inside one
transaction.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.peers.djtasks.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from benchmarks.peers.common import emit, open_loop  # noqa: E402
from benchmarks.peers.djtasks.tasks import latency, noop, sleep_1ms  # noqa: E402


def main(command: str, args: list[str]) -> None:
    if command == "setup":
        call_command("migrate", verbosity=0)
        emit({})
    elif command == "enqueue":
        n, sleep_ms = int(args[0]), float(args[1]) if len(args) > 1 else 0.0
        task = sleep_1ms if sleep_ms else noop
        started = time.perf_counter()
        with transaction.atomic():
            for _ in range(n):
                task.enqueue()
        emit({"jobs": n, "seconds": time.perf_counter() - started})
    elif command == "latency-enqueue":
        count, interval, out = int(args[0]), float(args[1]), args[2]
        open_loop(lambda: latency.enqueue().id, count, interval, out)
        emit({"jobs": count})
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
