"""Growth check: does a claim cost more when the table holds many finished jobs?

    DJANGO_SETTINGS_MODULE=benchmarks.benchproject.settings \\
        python -m benchmarks.growth [--finished 10000,1000000] [--backlog 1000000] \\
        [--claims 2000] [--batch 10] [--reps 3]

For each size: the table is emptied, F finished rows are inserted with
``INSERT … SELECT generate_series`` (older, lower ids), then enough queued rows
for the claims, then ``VACUUM ANALYZE``. ``--backlog B`` adds a case: the smallest
size with B more queued rows (claims at the head of a backlog). The worker's own claim statement
(``django_dbworker.sql.jobs``, prepared, through the worker's connection
class) claims ``--batch`` jobs at a time, each batch completed with the worker's
complete statement; only the claims are timed. Prints JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.db import connection  # noqa: E402

from benchmarks.benchproject.models import BenchJob  # noqa: E402
from benchmarks.peers.common import emit  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from django_dbworker.sql.connection import Connection  # noqa: E402
from django_dbworker.sql.jobs import statements_for  # noqa: E402

TABLE = BenchJob._meta.db_table
WORKER = "growth:bench"


def fill(finished: int, queued: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
        cursor.execute(
            f"INSERT INTO {TABLE} (state, queued_at, started_at, finished_at, worker_hostname) "
            "SELECT 'completed', now() - interval '1 day', now() - interval '1 day', "
            "now() - interval '1 day', 'old' FROM generate_series(1, %s)",
            [finished],
        )
        cursor.execute(
            f"INSERT INTO {TABLE} (state) SELECT 'queued' FROM generate_series(1, %s)", [queued]
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


def time_claims(claims: int, batch: int) -> list[float]:
    """Seconds per claim statement, ``claims`` of them."""
    stmts = statements_for(BenchJob, "postgresql", "default")
    claim = stmts.claim(stmts.order_by(("pk",)), limit=batch)
    conn = Connection("default", "growth")
    times = []
    try:
        for _ in range(claims):
            started = time.perf_counter()
            rows = conn.execute(
                claim,
                {"worker": WORKER, "max_retries": 0, "held": stmts.ids_param([]), "limit": batch},
            )
            times.append(time.perf_counter() - started)
            ids = [row[stmts.rows.pk_index] for row in rows]
            if len(ids) != batch:
                raise RuntimeError(f"claimed {len(ids)} rows, expected {batch}")
            conn.execute(stmts.complete, {"ids": stmts.ids_param(ids), "worker": WORKER})
    finally:
        conn.close()
    return times


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--finished", default="10000,1000000")
    parser.add_argument("--backlog", type=int, default=0)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.finished.split(",")]
    queued = args.claims * args.batch + 1000
    # (name, finished rows, queued rows)
    cases = [(str(size), size, queued) for size in sizes]
    if args.backlog:
        cases.append((f"{min(sizes)}, {args.backlog} queued", min(sizes), queued + args.backlog))
    per_size: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in cases}
    for _ in range(args.reps):
        for name, finished, waiting in cases:  # interleaved: drift hits every case
            fill(finished, waiting)
            times = time_claims(args.claims, args.batch)
            per_size[name].append(
                {
                    "median_ms": statistics.median(times) * 1000,
                    "p90_ms": percentile(times, 90) * 1000,
                    "mean_ms": statistics.fmean(times) * 1000,
                }
            )
    result: dict[str, Any] = {
        "claims": args.claims,
        "batch": args.batch,
        "reps": args.reps,
        "backlog": args.backlog,
        "sizes": {},
    }
    for size, reps in per_size.items():
        result["sizes"][size] = {
            "median_ms": statistics.median(r["median_ms"] for r in reps),
            "p90_ms": statistics.median(r["p90_ms"] for r in reps),
            "mean_ms": statistics.median(r["mean_ms"] for r in reps),
            "median_ms_per_rep": [r["median_ms"] for r in reps],
        }
    small = result["sizes"][str(min(sizes))]["median_ms"]
    result["slowdown_percent"] = {
        name: (row["median_ms"] / small - 1) * 100 for name, row in result["sizes"].items()
    }
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
    emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])
