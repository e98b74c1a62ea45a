"""Fair claims (issue 43, item 2): a small tenant behind a large one's backlog.

    DJANGO_SETTINGS_MODULE=benchmarks.benchproject.settings \\
        python -m benchmarks.fairness [--backlog 100000] [--small 100] \\
        [--handlers 16] [--after 1.0] [--reps 3]

Tenant A's ``--backlog`` jobs are in the table when ``runworker --burst`` starts (the
no-op handler, ``--handlers`` threads); ``--after`` seconds after its first job
completed, tenants B and C enqueue ``--small`` jobs each (one INSERT each). Measured
from the database's times once the worker has drained everything:

- ``wait`` of B's and C's jobs: ``started_at - queued_at`` (p50, p99, max, ms);
- ``jobs_per_s``: every job, from the first start to the last finish;
- ``claim_ms`` (``--claims``, without a worker): the claim statement of each handler
  over the same table (A's backlog, then B's and C's jobs), ``--batch`` rows, each
  batch completed, the two claims alternating in blocks of 50: the median time of a
  statement. Less noisy than a drain on a shared machine.

Two handlers, interleaved rep by rep: ``ordered`` (the plain claim: oldest first)
and ``fair`` (``fair_by = "tenant"``). The table has the fair index for both
(``fair_index("tenant")``, made here). Prints JSON; ``throughput_ratio`` is fair's
median jobs/s over ordered's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.db import connection  # noqa: E402

from benchmarks.benchproject.models import BenchJob  # noqa: E402
from benchmarks.peers.common import emit  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from django_dbworker.sql.connection import Connection  # noqa: E402
from django_dbworker.sql.fair import FairClaims  # noqa: E402
from django_dbworker.sql.jobs import statements_for  # noqa: E402

TABLE = BenchJob._meta.db_table
INDEX = "benchproject_benchjob_fair"
ROOT = Path(__file__).resolve().parent.parent
HANDLERS = {
    "ordered": "benchmarks.benchproject.handlers.NoopHandler",
    "fair": "benchmarks.benchproject.handlers.FairNoopHandler",
}
A, B, C = 1, 2, 3


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def enqueue(tenant: int, count: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (state, tenant) SELECT 'queued', %s FROM generate_series(1, %s)",
            [tenant, count],
        )


def prepare(backlog: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
        # fair_index("tenant"): the dequeue index's condition, by tenant then id.
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON {TABLE} (tenant, id) "
            "WHERE state IN ('queued', 'errored') AND process_after IS NULL"
        )
    enqueue(A, backlog)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


def started(worker: subprocess.Popen[bytes], timeout: float) -> None:
    """Once the worker has completed a job of the backlog (it has started: a loaded
    machine takes seconds to start a process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.poll() is None:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {TABLE} WHERE state = 'completed' LIMIT 1")
            if cursor.fetchone():
                return
        time.sleep(0.05)
    raise RuntimeError("the worker did not start")


def run(case: str, args: argparse.Namespace) -> dict[str, float]:
    prepare(args.backlog)
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", HANDLERS[case], "--burst"]
        + ["--num-handlers", str(args.handlers), "-v", "0"],
        cwd=ROOT,
    )
    try:
        started(worker, args.timeout)
        time.sleep(args.after)
        enqueue(B, args.small)
        enqueue(C, args.small)
        if worker.wait(args.timeout) != 0:
            raise RuntimeError(f"runworker exited with {worker.returncode}")
    finally:
        if worker.poll() is None:
            worker.kill()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT extract(epoch from started_at - queued_at) * 1000 FROM {TABLE} "
            "WHERE tenant IN (%s, %s) AND state = 'completed'",
            [B, C],
        )
        waits = [float(row[0]) for row in cursor.fetchall()]
        cursor.execute(
            f"SELECT count(*), extract(epoch from max(finished_at) - min(started_at)) "
            f"FROM {TABLE} WHERE state = 'completed'"
        )
        count, seconds = cursor.fetchone()
    total = args.backlog + 2 * args.small
    if count != total or len(waits) != 2 * args.small:
        raise RuntimeError(f"{count} of {total} jobs completed")
    return {
        "wait_p50_ms": percentile(waits, 50),
        "wait_p99_ms": percentile(waits, 99),
        "wait_max_ms": max(waits),
        "jobs_per_s": count / float(seconds),
    }


def claim_times(args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds per claim statement of each case (``claim_ms`` above)."""
    prepare(args.backlog)
    enqueue(B, args.small)
    enqueue(C, args.small)
    stmts = statements_for(BenchJob, "postgresql", "default")
    order = stmts.order_by(("pk",))
    fair = FairClaims(stmts, "tenant", order, ("", {}))
    sqls = {
        "ordered": stmts.claim(order, limit=args.batch, max_retries=0),
        "fair": fair.claim("", None, None, args.batch, 0, False),
    }
    params = {"worker": "fair:1:a", "max_retries": 0, "held": stmts.ids_param([])}
    params["limit"] = args.batch
    times: dict[str, list[float]] = {case: [] for case in sqls}
    conn = Connection("default", "fairness")
    try:
        for _block in range(args.claims // 50):
            for case, sql in sqls.items():
                for _ in range(50):
                    started = time.perf_counter()
                    rows = conn.execute(sql, params)
                    times[case].append(time.perf_counter() - started)
                    ids = stmts.ids_param([row[stmts.rows.pk_index] for row in rows])
                    conn.execute(stmts.complete, {"ids": ids, "worker": "fair:1:a"})
    finally:
        conn.close()
    return times


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--handlers", type=int, default=16)
    parser.add_argument("--after", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--claims", type=int, default=2000, help="claims per case (0: none)")
    parser.add_argument("--batch", type=int, default=4, help="rows per claim")
    args = parser.parse_args(argv)
    measured: dict[str, dict[str, list[float]]] = {case: {} for case in HANDLERS}
    try:
        if args.claims:
            for case, values in claim_times(args).items():
                measured[case]["claim_ms"] = [statistics.median(values) * 1000]
            log(
                "claim statement, median: "
                + ", ".join(f"{c} {m['claim_ms'][0]:.3f} ms" for c, m in measured.items())
            )
        for rep in range(args.reps):
            for case in HANDLERS:  # interleaved: drift hits both
                figures = run(case, args)
                for name, value in figures.items():
                    measured[case].setdefault(name, []).append(value)
                log(
                    f"rep {rep + 1} {case}: B/C wait p50 {figures['wait_p50_ms']:.0f} ms, "
                    f"p99 {figures['wait_p99_ms']:.0f} ms; {figures['jobs_per_s']:.0f} jobs/s"
                )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
            cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")
    result: dict[str, Any] = {"options": vars(args), "cases": {}}
    for case, row in measured.items():
        result["cases"][case] = {
            name: {"median": statistics.median(values), "values": values}
            for name, values in row.items()
        }
    cases = result["cases"]
    if args.reps:
        result["throughput_ratio"] = (
            cases["fair"]["jobs_per_s"]["median"] / cases["ordered"]["jobs_per_s"]["median"]
        )
    if args.claims:
        result["claim_ratio"] = (
            cases["fair"]["claim_ms"]["median"] / (cases["ordered"]["claim_ms"]["median"])
        )
    emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])
