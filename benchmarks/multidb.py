"""One ``runworker`` draining job tables on two PostgreSQL servers, against the same
tables on one server (issue 43, docs/operations.md § Several databases).

    python -m benchmarks.multidb [--jobs 40000] [--reps 3] [--handlers 32] [--out FILE]

Starts two PostgreSQL servers of its own on this machine (tests/clusters.py: as root
they run as ``postgres``; PostgreSQL's binaries from ``DBWORKER_TEST_PG_BIN``,
``pg_config`` or ``/usr/lib/postgresql/*/bin``), with the same settings, and migrates
the benchmark project on both. Then, ``--reps`` times, the two arrangements in turn:

- ``one server``: ``BenchJob`` and ``OtherBenchJob`` on the first server;
- ``two servers``: ``OtherBenchJob`` on the second (``BENCH_SECOND_URL``,
  benchmarks/benchproject/routers.py).

Each run enqueues ``--jobs``/2 fresh jobs in each table (plain SQL) and drains them with
one ``runworker NoopHandler OtherNoopHandler --num-handlers K --prefetch K --burst``
(K = ``--handlers``, threads and prefetch of each of the two handlers). Throughput is
the jobs over the span from the first start to the last finish (read from the tables);
CPU is the worker process's per job (user and system; the CPU of a run that finds no
job, its start and stop, taken off); WAL is the busiest server's, per job (what one
server writes for the drain). Prints the median and range of each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.clusters import SecondCluster, binaries, clean_stale  # noqa: E402

NAME = "dbworker_bench_multidb"
TABLES = ("benchproject_benchjob", "benchproject_otherbenchjob")
HANDLERS = (
    "benchmarks.benchproject.handlers.NoopHandler",
    "benchmarks.benchproject.handlers.OtherNoopHandler",
)


def manage(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def environment(first: str, second: str | None) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.benchproject.settings",
        "BENCH_DATABASE_URL": first,
        "PYTHONPATH": str(ROOT),
    }
    env.pop("BENCH_SECOND_URL", None)
    if second is not None:
        env["BENCH_SECOND_URL"] = second
    return env


def run_sql(url: str, *statements: str) -> list[Any]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        rows: list[Any] = []
        for sql in statements:
            cursor = conn.execute(sql)
            if cursor.description:
                rows = cursor.fetchall()
        return rows


def fill(url: str, table: str, jobs: int) -> None:
    run_sql(
        url,
        f"TRUNCATE {table} RESTART IDENTITY CASCADE",
        f"INSERT INTO {table} (state) SELECT 'queued' FROM generate_series(1, {int(jobs)})",
        f"VACUUM ANALYZE {table}",
    )


def wal(url: str) -> int:
    """The server's WAL position, in bytes."""
    [(position,)] = run_sql(url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return int(position)


def span(url: str, table: str) -> tuple[int, float, float]:
    [(count, first, last)] = run_sql(
        url,
        f"SELECT count(*), extract(epoch FROM min(started_at)), "
        f"extract(epoch FROM max(finished_at)) FROM {table} WHERE state = 'completed'",
    )
    return int(count), float(first or 0.0), float(last or 0.0)


def worker_cpu(env: dict[str, str], handlers: int) -> float:
    """One ``runworker --burst`` of both handlers: its CPU seconds (user and system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "django", "runworker", *HANDLERS]
        + ["--num-handlers", str(handlers), "--prefetch", str(handlers), "--burst", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"runworker failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def drain(urls: dict[str, str], env: dict[str, str], jobs: int, handlers: int) -> dict[str, float]:
    """One drain: ``jobs``/2 in each table (``urls``: table → server); the CPU of a
    worker that finds nothing (its start and stop) is taken off."""
    for table, url in urls.items():
        fill(url, table, 0)
    idle = worker_cpu(env, handlers)
    for table, url in urls.items():
        fill(url, table, jobs // 2)
    servers = sorted(set(urls.values()))
    wal_before = {url: wal(url) for url in servers}
    cpu = worker_cpu(env, handlers) - idle
    written = [wal(url) - wal_before[url] for url in servers]
    spans = [span(url, table) for table, url in urls.items()]
    count = sum(s[0] for s in spans)
    if count != jobs // 2 * 2:
        raise SystemExit(f"{count} jobs completed of {jobs // 2 * 2}")
    seconds = max(s[2] for s in spans) - min(s[1] for s in spans)
    return {
        "jobs_per_s": count / seconds,
        "cpu_us_per_job": 1e6 * cpu / count,
        # The busiest server's WAL per job: the database work one server takes.
        "busiest_server_wal_bytes_per_job": max(written) / count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--handlers", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    bin_dir = binaries()
    if bin_dir is None:
        raise SystemExit("initdb and pg_ctl not found (DBWORKER_TEST_PG_BIN)")
    clean_stale()
    servers = [SecondCluster(bin_dir) for _ in range(2)]
    try:
        for server in servers:
            server.init()
            server.start()
            server.wait_ready()
            server.create_database(NAME)
        first, second = (server.url(NAME) for server in servers)
        env_one, env_two = environment(first, None), environment(first, second)
        for env, database in ((env_two, "default"), (env_two, "second")):
            migrated = manage(env, "migrate", "--database", database, "-v", "0")
            if migrated.returncode != 0:
                raise SystemExit(f"migrate failed:\n{migrated.stderr}")
        arrangements = {
            "one server": ({TABLES[0]: first, TABLES[1]: first}, env_one),
            "two servers": ({TABLES[0]: first, TABLES[1]: second}, env_two),
        }
        results: dict[str, list[dict[str, float]]] = {name: [] for name in arrangements}
        for rep in range(args.reps):
            for name, (urls, env) in arrangements.items():
                figures = drain(urls, env, args.jobs, args.handlers)
                results[name].append(figures)
                print(f"rep {rep + 1} {name}: {json.dumps(figures)}", flush=True)
                time.sleep(1)
        summary = {
            name: {
                key: {
                    "median": statistics.median(r[key] for r in runs),
                    "min": min(r[key] for r in runs),
                    "max": max(r[key] for r in runs),
                }
                for key in ("jobs_per_s", "cpu_us_per_job", "busiest_server_wal_bytes_per_job")
            }
            for name, runs in results.items()
        }
        report = {"jobs": args.jobs, "handlers": args.handlers, "reps": args.reps, **summary}
        print(json.dumps(report, indent=2))
        if args.out:
            args.out.write_text(json.dumps({**report, "runs": results}, indent=2) + "\n")
    finally:
        for server in servers:
            server.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
