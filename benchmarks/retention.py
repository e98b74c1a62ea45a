"""Claim latency while retention prunes a million finished rows (issue 12).

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/dbworker_bench \\
        python -m benchmarks.retention [--rows 1000000] [--seconds 20] [--out FILE]

1. The benchmark's job table gets ``--rows`` completed jobs, finished 30 days ago, and
   a backlog of queued jobs.
2. A ``runworker`` process drains the backlog (a handler that waits 1 ms per job,
   4 threads) for the whole run.
3. A probe claims one job at a time with the engine's own claim statement (as the
   worker builds it for the handler) and completes it, timing each claim: first for
   ``--seconds`` with nothing else going on (idle), then while ``Retention`` prunes
   the old rows as fast as it can, in its batches of 100 (the worst case: a worker
   prunes for at most 2 s every ``RETENTION_INTERVAL``). Another model references the
   job model (``BenchNote``, a foreign key with CASCADE, ``--notes`` of the old rows
   referenced), so retention deletes through Django's collector, honouring it.

Prints (and writes to ``--out``) the claim p50/p99 of both phases and the pruning rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from benchmarks.benchproject.handlers import SleepHandler  # noqa: E402
from benchmarks.benchproject.models import BenchJob, BenchNote  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from django_dbworker.maintenance.retention import Retention  # noqa: E402
from django_dbworker.sql.jobs import statements_for  # noqa: E402

TABLE = BenchJob._meta.db_table
NOTES = BenchNote._meta.db_table


class Pruned(SleepHandler):
    retention = {"completed": timedelta(days=1)}


def fill(rows: int, backlog: int, notes: float = 0.0) -> None:
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE}, {NOTES} RESTART IDENTITY")
        cursor.execute(
            f"INSERT INTO {TABLE} (state, started_at, finished_at) SELECT 'completed', "
            "now() - interval '30 days', now() - interval '30 days' "
            "FROM generate_series(1, %s)",
            [rows],
        )
        # Every 1/notes-th finished job has a note (ON DELETE CASCADE through Django).
        if notes:
            cursor.execute(
                f"INSERT INTO {NOTES} (job_id) SELECT id FROM {TABLE} WHERE id %% %s = 0",
                [max(round(1 / notes), 1)],
            )
        cursor.execute(
            f"INSERT INTO {TABLE} (state) SELECT 'queued' FROM generate_series(1, %s)", [backlog]
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")
        cursor.execute(f"VACUUM ANALYZE {NOTES}")


def probe(seconds: float, stop: threading.Event | None = None) -> list[float]:
    """Claim and complete one job at a time for ``seconds``; each claim's latency (ms)."""
    stmts = statements_for(BenchJob, "postgresql", "default")
    claim = stmts.claim(stmts.order_by(("pk",)), limit=1)
    complete = f"UPDATE {TABLE} SET state = 'completed', finished_at = now() WHERE id = %(pk)s"
    params: dict[str, Any] = {
        "worker": "probe",
        "max_retries": 0,
        "held": stmts.ids_param([]),
        "limit": 1,
    }
    latencies = []
    deadline = time.monotonic() + seconds
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            started = time.perf_counter()
            cursor.execute(claim, params)
            rows = cursor.fetchall()
            latencies.append((time.perf_counter() - started) * 1000)
            if rows:
                cursor.execute(complete, {"pk": rows[0][0]})
            time.sleep(0.002)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--notes",
        type=float,
        default=0.1,
        help="Share of the finished jobs another model references (ON DELETE CASCADE); the "
        "job model is referenced either way, so retention deletes through Django's "
        "collector (default: %(default)s).",
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    backlog = int(args.seconds * 2 * 4_000)
    fill(args.rows, backlog, args.notes)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "runworker",
            "benchmarks.benchproject.handlers.SleepHandler",
            "--num-handlers",
            "4",
            "--no-resetter",
            "-v",
            "0",
        ],
    )
    try:
        time.sleep(3.0)  # the worker is up and draining
        idle = probe(args.seconds)
        retention = Retention([Pruned()])
        pruned: dict[str, Any] = {}
        done = threading.Event()

        def prune() -> None:
            started = time.monotonic()
            total = 0
            while True:
                count = sum(retention.run_once(budget=1.0).values())
                total += count
                if not count:
                    break
            pruned.update(rows=total, seconds=time.monotonic() - started)
            done.set()

        thread = threading.Thread(target=prune)
        thread.start()
        during = probe(args.seconds, stop=done)
        thread.join()
        retention.close()
    finally:
        worker.terminate()
        worker.wait(30)
    result = {
        "rows": args.rows,
        "notes": args.notes,
        "idle": {
            "claims": len(idle),
            "p50_ms": percentile(idle, 50),
            "p99_ms": percentile(idle, 99),
        },
        "pruning": {
            "claims": len(during),
            "p50_ms": percentile(during, 50),
            "p99_ms": percentile(during, 99),
        },
        "pruned": pruned,
    }
    result["p99_ratio"] = result["pruning"]["p99_ms"] / result["idle"]["p99_ms"]
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
