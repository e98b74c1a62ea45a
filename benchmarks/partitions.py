"""Retention on a partitioned job table: dropping a day's partition vs the batched
DELETE of the same rows (issue 43).

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/dbworker_bench \\
        python -m benchmarks.partitions [--rows 200000] [--drop-only] [--out FILE]

1. Plain: the benchmark's job table gets ``--rows`` completed jobs finished 30 days ago
   and a backlog; retention's own ``DELETE`` (``JobStatements.prune``, 100 rows a
   statement, a rest as long as each batch: what ``Retention`` runs) deletes them all
   while a probe claims and completes one job at a time, timing each claim.
2. Partitioned: a partitioned copy of the table (``sql.partitions``' statements) gets the
   same rows in the partition of their day (30 days ago) and the same backlog; the day's
   partition is detached (``ACCESS EXCLUSIVE`` on the table: the time it is held is
   timed) and dropped, as ``maintenance.partitions`` does, while the probe claims.

Prints (and writes to ``--out``) the time each took, the longest a statement held its
locks, and the probe's claim p50/p99/max in each phase.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import threading
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.db import connection, connections  # noqa: E402

from benchmarks.benchproject.models import BenchJob  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from django_dbworker.sql import partitions as sql  # noqa: E402
from django_dbworker.sql.jobs import statements_for  # noqa: E402

PLAIN = BenchJob._meta.db_table
PARTED = "bench_parted_jobs"
BACKLOG = 50_000
DAY = datetime.datetime.now(datetime.UTC).date() - datetime.timedelta(days=30)


def execute(statement: str, params: Any = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def fill_plain(rows: int) -> None:
    if PLAIN not in connection.introspection.table_names():
        # The job table as its model declares it (not ``migrate``: this benchmark needs
        # no other table).
        with connection.schema_editor() as editor:
            editor.create_model(BenchJob)
    execute(f"TRUNCATE {PLAIN} CASCADE")
    execute(
        f"INSERT INTO {PLAIN} (state, started_at, finished_at) SELECT 'completed', "
        "now() - interval '30 days', now() - interval '30 days' FROM generate_series(1, %s)",
        [rows],
    )
    execute(f"INSERT INTO {PLAIN} (state) SELECT 'queued' FROM generate_series(1, %s)", [BACKLOG])
    execute(f"VACUUM ANALYZE {PLAIN}")


def fill_partitioned(rows: int) -> None:
    """The partitioned copy: PLAIN's columns and indexes, made as ``PartitionJobTable``
    makes a table partitioned, with the day's rows and the backlog."""
    legacy = sql.partition_name(PARTED, "_legacy")
    execute(f"DROP TABLE IF EXISTS {PARTED}, {legacy} CASCADE")
    execute(f"CREATE TABLE {legacy} (LIKE {PLAIN} INCLUDING DEFAULTS INCLUDING IDENTITY)")
    execute(f"ALTER TABLE {legacy} ADD COLUMN {sql.KEY} date NOT NULL DEFAULT '{sql.ACTIVE_DAY}'")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "ORDER BY ordinal_position",
            [legacy],
        )
        columns = [c for (c,) in cursor.fetchall()]
    for statement in sql.convert_head(PARTED, "id", columns, has_rows=False):
        execute(statement)
    # The indexes WorkerJob.Meta declares (dequeue, waiting, state).
    execute(
        f"CREATE INDEX {PARTED}_dq ON {PARTED} (id) "
        "WHERE state IN ('queued', 'errored') AND process_after IS NULL"
    )
    execute(f"CREATE INDEX {PARTED}_st ON {PARTED} (state) WHERE state <> 'completed'")
    for statement in sql.convert_tail(PARTED, "id", has_rows=False):
        execute(statement)
    today = datetime.datetime.now(datetime.UTC).date()
    for day in (DAY, *sql.days_to_make(today, 3)):
        execute(sql.create_day(PARTED, day))
    execute(
        f"INSERT INTO {PARTED} (state, started_at, finished_at, {sql.KEY}) SELECT 'completed', "
        "now() - interval '30 days', now() - interval '30 days', %s FROM generate_series(1, %s)",
        [DAY, rows],
    )
    execute(f"INSERT INTO {PARTED} (state) SELECT 'queued' FROM generate_series(1, %s)", [BACKLOG])
    execute(f"VACUUM ANALYZE {PARTED}")


def probe(table: str, stop: threading.Event, partitioned: bool) -> list[float]:
    """Claim (the claim's shape: the first claimable row, SKIP LOCKED) and complete one
    job at a time until ``stop``; each claim's latency (ms)."""
    active = f" AND {sql.KEY} = '{sql.ACTIVE_DAY}'" if partitioned else ""
    claim = (
        f"UPDATE {table} SET state = 'processing', started_at = now() WHERE id = ANY(ARRAY("
        f"SELECT id FROM {table} WHERE state IN ('queued', 'errored') AND process_after IS NULL"
        f"{active} ORDER BY id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED)){active} RETURNING id"
    )
    moved = f", {sql.KEY} = CAST(now() AT TIME ZONE 'UTC' AS date)" if partitioned else ""
    complete = f"UPDATE {table} SET state = 'completed', finished_at = now(){moved} WHERE id = %s"
    latencies = []
    with connections["probe"].cursor() as cursor:
        while not stop.is_set():
            started = time.perf_counter()
            cursor.execute(claim)
            rows = cursor.fetchall()
            latencies.append((time.perf_counter() - started) * 1000)
            if rows:
                cursor.execute(complete, [rows[0][0]])
            time.sleep(0.002)
    return latencies


def probed(table: str, partitioned: bool, work: Any) -> tuple[Any, dict[str, Any]]:
    """Run ``work()`` while the probe claims; its result and the claims' figures."""
    stop, latencies = threading.Event(), []
    thread = threading.Thread(
        target=lambda: latencies.extend(probe(table, stop, partitioned)), daemon=True
    )
    thread.start()
    time.sleep(2.0)  # the probe's idle claims come first
    try:
        result = work()
    finally:
        time.sleep(0.5)
        stop.set()
        thread.join(30)
    figures = {
        "claims": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "max_ms": round(max(latencies), 2),
    }
    return result, figures


def delete_in_batches() -> dict[str, Any]:
    """Retention's plain batched DELETE until no row is due."""
    stmts = statements_for(BenchJob, "postgresql", "default")
    delete = stmts.prune(stmts.not_among("spare"))
    values = {"state": "completed", "age": 86400.0, "batch": 100, "spare": stmts.ids_param([])}
    started, longest, total = time.monotonic(), 0.0, 0
    with connection.cursor() as cursor:
        while True:
            began = time.monotonic()
            cursor.execute(delete, values)
            count = len(cursor.fetchall())
            took = time.monotonic() - began
            longest, total = max(longest, took), total + count
            if count < 100:
                break
            time.sleep(took)  # Retention's REST
    return {
        "rows": total,
        "seconds": round(time.monotonic() - started, 2),
        "longest_statement_s": round(longest, 4),
    }


def drop_partition() -> dict[str, Any]:
    """Detach (``ACCESS EXCLUSIVE`` on the table, bounded as the maintenance pass does)
    and drop the day's partition."""
    name = sql.day_name(PARTED, DAY)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {name}")
        rows = cursor.fetchone()[0]
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(sql.lock_timeout(1.0))
        cursor.execute(sql.detach(PARTED, name))
        cursor.execute("COMMIT")
    detached = time.monotonic() - started
    with connection.cursor() as cursor:
        cursor.execute(sql.drop(name))
    return {
        "rows": rows,
        "seconds": round(time.monotonic() - started, 3),
        "table_locked_s": round(detached, 4),
        "drop_s": round(time.monotonic() - started - detached, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument(
        "--drop-only",
        action="store_true",
        help="Only the partitioned phase (the batched DELETE of 1,500,000 rows takes minutes).",
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    from django.conf import settings

    settings.DATABASES["probe"] = dict(settings.DATABASES["default"])
    result: dict[str, Any] = {"rows": args.rows}
    if not args.drop_only:
        fill_plain(args.rows)
        deleted, plain_claims = probed(PLAIN, False, delete_in_batches)
        result["batched_delete"] = {**deleted, "claims": plain_claims}
    fill_partitioned(args.rows)
    dropped, parted_claims = probed(PARTED, True, drop_partition)
    execute(f"DROP TABLE IF EXISTS {PARTED} CASCADE")
    result["partition_drop"] = {**dropped, "claims": parted_claims}
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
