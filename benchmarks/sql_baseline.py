"""The database's own ceiling: claim + complete in plain SQL, no queue library.

Runs on django_dbworker's benchmark table (same columns, same partial dequeue
index), measured like every system: N rows queued, drained, and throughput =
N / (last finished_at - first started_at) read back from the table.

- pgbench, several clients: claim a batch (one statement, committed) then complete
  it (one statement, committed); the same with a batch of one.
- a plain psycopg 3 loop in one process with prepared statements, batch 100/10/1.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit

import psycopg

from . import pg

TABLE = "benchproject_benchjob"

CLAIM = (
    f"UPDATE {TABLE} SET state = 'processing', started_at = now(), "
    "last_heartbeat_at = now(), finished_at = NULL, failure_message = NULL, "
    "execution_logs = '[]', worker_hostname = 'sql' "
    f"WHERE id IN (SELECT id FROM {TABLE} WHERE state IN ('queued', 'errored') "
    "AND (process_after IS NULL OR process_after <= now()) "
    "ORDER BY id LIMIT {limit} FOR NO KEY UPDATE SKIP LOCKED) RETURNING id"
)
COMPLETE = (
    f"UPDATE {TABLE} SET state = 'completed', finished_at = now() "
    "WHERE id = ANY({ids}) AND state = 'processing' AND worker_hostname = 'sql'"
)
MEASURE = (
    "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
    f"FROM {TABLE} WHERE state = 'completed'"
)

#: (kind, batch, clients, jobs) of each configuration.
CONFIGS: list[tuple[str, int, int, int]] = [
    ("pgbench", 50, 4, 100_000),
    ("pgbench", 1, 4, 10_000),
    ("psycopg", 100, 1, 50_000),
    ("psycopg", 10, 1, 20_000),
    ("psycopg", 1, 1, 5_000),
]


def label(kind: str, batch: int, clients: int) -> str:
    who = f"pgbench, {clients} clients" if kind == "pgbench" else "psycopg loop, 1 process"
    return f"SQL {who}, claim+complete batch {batch}"


def fill(dsn: str, n: int) -> None:
    pg.execute(
        dsn,
        f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE",
        f"INSERT INTO {TABLE} (state) SELECT 'queued' FROM generate_series(1, {int(n)})",
        f"VACUUM ANALYZE {TABLE}",
    )


def run_pgbench(dsn: str, batch: int, clients: int, jobs: int) -> None:
    script = (
        f"WITH c AS ({CLAIM.format(limit=batch)}) "
        "SELECT coalesce(array_agg(id), '{}') AS ids FROM c\n\\gset\n"
        f"{COMPLETE.format(ids=':ids::bigint[]')};\n"
    )
    url = urlsplit(dsn)
    per_client = jobs // (clients * batch)
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(script)
        f.flush()
        subprocess.run(
            [
                "pgbench",
                "-n",
                "-M",
                "prepared",
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-t",
                str(per_client),
                "-f",
                f.name,
                "-h",
                url.hostname or "127.0.0.1",
                "-p",
                str(url.port or 5432),
                "-U",
                url.username or "postgres",
                url.path.lstrip("/"),
            ],
            check=True,
            capture_output=True,
        )


def run_psycopg(dsn: str, batch: int) -> None:
    claim = CLAIM.format(limit="%s")
    complete = COMPLETE.format(ids="%s")
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        while True:
            ids = [row[0] for row in conn.execute(claim, (batch,)).fetchall()]
            if not ids:
                break
            conn.execute(complete, (ids,))


def measure_once(dsn: str, kind: str, batch: int, clients: int, jobs: int) -> float:
    if kind == "pgbench":
        jobs = jobs // (clients * batch) * clients * batch
    fill(dsn, jobs)
    started = time.monotonic()
    if kind == "pgbench":
        run_pgbench(dsn, batch, clients, jobs)
    else:
        run_psycopg(dsn, batch)
    wall = time.monotonic() - started
    count, seconds = pg.one(dsn, MEASURE)
    if int(count) != jobs:
        raise RuntimeError(f"{label(kind, batch, clients)}: {count} of {jobs} jobs completed")
    del wall
    return jobs / float(seconds)


def configs(pgbench: bool, scale: float) -> list[tuple[str, int, int, int]]:
    chosen = [c for c in CONFIGS if pgbench or c[0] != "pgbench"]
    return [(k, b, c, max(int(n * scale), b * c * 10)) for k, b, c, n in chosen]


def describe(kind: str, batch: int, clients: int, jobs: int) -> dict[str, Any]:
    return {
        "label": label(kind, batch, clients),
        "kind": kind,
        "batch": batch,
        "clients": clients,
        "jobs": jobs,
    }
