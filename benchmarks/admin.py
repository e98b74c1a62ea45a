"""The admin at a million rows (issue 14): server time and queries per page.

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/dbworker_admin_bench \\
        python -m benchmarks.admin [--rows 1000000] [--claimable 100000] [--reps 5] \\
        [--waiting 0] [--keep] [--out FILE]

1. The database is created afresh (``--keep``: reused if it already holds the rows),
   migrated, and the benchmark's job table gets ``--rows`` jobs with plain
   ``INSERT … SELECT generate_series``: ``--claimable`` of them queued or errored
   (some scheduled for later), a few hundred processing, the rest finished over the
   last 30 days (completed, some failed and canceled, with failure messages and
   attempt histories), by 20 workers; the worker registry gets those 20 workers
   (alive) and ``JobStats`` a day of per-minute rows of 4 of them. ``--waiting N``
   adds N jobs queued for tomorrow and N errored ones whose retry is tomorrow (jobs
   for later: the admin's scheduled counts and filters). ``VACUUM ANALYZE``.
2. Each page (the job list with each filter, the dashboard, job pages) is fetched
   with the Django test client as a superuser, once to warm up, then ``--reps``
   times: the median time of the request (in this process: the server's whole work,
   SQL included) and the number of queries it ran.

Prints a table and (``--out``) writes JSON. On MariaDB
(``BENCH_DATABASE_URL=mysql://root@127.0.0.1:3306/dbworker_admin_bench``) the same
rows come from its sequence tables, then ``ANALYZE TABLE``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.admin_settings")
os.environ.setdefault(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/dbworker_admin_bench"
)

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib import admin  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_test_environment  # noqa: E402
from django.urls import NoReverseMatch, reverse  # noqa: E402

from benchmarks.benchproject.models import BenchJob  # noqa: E402
from benchmarks.pg import recreate_database  # noqa: E402

TABLE = BenchJob._meta.db_table
WORKERS = 20
HANDLER = "benchmarks.benchproject.handlers.NoopHandler"


def worker_id(n: int) -> str:
    return f"bench-{n}:{1000 + n}:{n:06x}"


def fill(rows: int, claimable: int, waiting: int = 0) -> None:
    finished = rows - claimable - 200
    workers = "ARRAY[" + ", ".join(f"'{worker_id(n)}'" for n in range(WORKERS)) + "]"
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
        # Finished jobs, oldest first: 97 % completed, 2 % failed, 1 % canceled.
        cursor.execute(
            f"INSERT INTO {TABLE} (state, queued_at, started_at, finished_at, worker_hostname, "
            "num_failures, failure_message, history, tenant) "
            "SELECT CASE WHEN i %% 100 < 97 THEN 'completed' WHEN i %% 100 < 99 THEN 'failed' "
            "ELSE 'canceled' END, t, t + interval '1 second', t + interval '3 seconds', "
            f"({workers})[1 + i %% {WORKERS}], CASE WHEN i %% 100 BETWEEN 97 AND 98 THEN 3 "
            "ELSE 0 END, CASE WHEN i %% 100 >= 97 THEN 'RuntimeError: boom ' || i END, "
            "CASE WHEN i %% 100 BETWEEN 97 AND 98 THEN jsonb_build_array(jsonb_build_object("
            "'worker', 'bench-1:1001:000001', 'started_at', t, 'ended_at', t, 'outcome', "
            "'errored', 'message', 'RuntimeError: boom', 'logs', '[]'::jsonb)) "
            "ELSE '[]'::jsonb END, i %% 100 "
            "FROM (SELECT i, now() - interval '30 days' * (1 - i::float / %s) AS t "
            "FROM generate_series(1, %s) AS i) AS s",
            [finished, finished],
        )
        cursor.execute(
            f"INSERT INTO {TABLE} (state, started_at, last_heartbeat_at, worker_hostname, "
            f"tenant) SELECT 'processing', now(), now(), ({workers})[1 + i %% {WORKERS}], "
            "i %% 100 FROM generate_series(1, 200) AS i",
            [],
        )
        # Claimable: 90 % queued (a tenth of them scheduled for later), 10 % errored.
        cursor.execute(
            f"INSERT INTO {TABLE} (state, process_after, num_failures, failure_message, "
            "tenant) SELECT CASE WHEN i %% 10 = 0 THEN 'errored' ELSE 'queued' END, "
            "CASE WHEN i %% 10 IN (0, 1) THEN now() + interval '1 hour' END, "
            "CASE WHEN i %% 10 = 0 THEN 1 ELSE 0 END, "
            "CASE WHEN i %% 10 = 0 THEN 'TimeoutError: slow' END, i %% 100 "
            "FROM generate_series(1, %s) AS i",
            [claimable],
        )
        for state, failures in (("queued", 0), ("errored", 1)):
            cursor.execute(
                f"INSERT INTO {TABLE} (state, process_after, num_failures, tenant) "
                "SELECT %s, now() + interval '1 day', %s, i %% 100 "
                "FROM generate_series(1, %s) AS i",
                [state, failures, waiting],
            )
        cursor.execute("DELETE FROM django_dbworker_workerprocess")
        cursor.execute(
            "INSERT INTO django_dbworker_workerprocess (worker_id, hostname, pid, handlers, "
            "num_handlers, jobs, num_jobs, heartbeat_interval, tables, started_at, "
            "last_heartbeat_at) SELECT 'bench-' || n || ':' || (1000 + n) || ':' || "
            "lpad(to_hex(n), 6, '0'), 'bench-' || n, 1000 + n, %s, 4, '[]', 0, 1.0, '{}', "
            "now() - interval '1 hour', now() FROM generate_series(0, %s) AS n",
            [json.dumps([HANDLER]), WORKERS - 1],
        )
        cursor.execute("DELETE FROM django_dbworker_jobstats")
        cursor.execute(
            "INSERT INTO django_dbworker_jobstats (minute, handler, model, worker, completed, "
            "errored, failed, canceled, requeued, lost, duration_sum, durations) "
            "SELECT date_trunc('minute', now()) - m * interval '1 minute', %s, "
            "'benchproject.BenchJob', 'bench-' || w, 600 + (m %% 60) * 5, m %% 7, m %% 3, 0, "
            "0, 0, 60.0, '[0,0,0,0,0,100,300,150,40,10,3,1,0,0,0,0,0,0,0]' "
            "FROM generate_series(0, 1439) AS m, generate_series(1, 4) AS w",
            [HANDLER],
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")
        cursor.execute("ANALYZE django_dbworker_workerprocess")
        cursor.execute("ANALYZE django_dbworker_jobstats")


def fill_mariadb(rows: int, claimable: int) -> None:
    """``fill`` on MariaDB: the same rows, from its sequence tables (``seq_1_to_N``)."""
    finished = rows - claimable - 200
    workers = ", ".join(f"'{worker_id(n)}'" for n in range(WORKERS))
    worker = f"ELT(1 + i %% {WORKERS}, {workers})"
    with connection.cursor() as cursor:  # a new database: the table is empty
        cursor.execute(
            f"INSERT INTO {TABLE} (state, queued_at, started_at, finished_at, worker_hostname, "
            "num_failures, failure_message, history, tenant) "
            "SELECT CASE WHEN i %% 100 < 97 THEN 'completed' WHEN i %% 100 < 99 THEN 'failed' "
            "ELSE 'canceled' END, t, t + INTERVAL 1 SECOND, t + INTERVAL 3 SECOND, "
            f"{worker}, CASE WHEN i %% 100 BETWEEN 97 AND 98 THEN 3 ELSE 0 END, "
            "CASE WHEN i %% 100 >= 97 THEN CONCAT('RuntimeError: boom ', i) END, "
            "CASE WHEN i %% 100 BETWEEN 97 AND 98 THEN JSON_ARRAY(JSON_OBJECT("
            "'worker', 'bench-1:1001:000001', 'started_at', t, 'ended_at', t, 'outcome', "
            "'errored', 'message', 'RuntimeError: boom', 'logs', JSON_ARRAY())) "
            "ELSE '[]' END, i %% 100 "
            "FROM (SELECT seq AS i, UTC_TIMESTAMP(6) - INTERVAL ROUND(2592000 * (1 - seq / %s)) "
            f"SECOND AS t FROM seq_1_to_{finished}) AS s",
            [finished],
        )
        cursor.execute(
            f"INSERT INTO {TABLE} (state, started_at, last_heartbeat_at, worker_hostname, "
            f"tenant) SELECT 'processing', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), {worker}, "
            "i %% 100 FROM (SELECT seq AS i FROM seq_1_to_200) AS s",
            [],
        )
        cursor.execute(
            f"INSERT INTO {TABLE} (state, process_after, num_failures, failure_message, "
            "tenant) SELECT CASE WHEN i %% 10 = 0 THEN 'errored' ELSE 'queued' END, "
            "CASE WHEN i %% 10 IN (0, 1) THEN UTC_TIMESTAMP(6) + INTERVAL 1 HOUR END, "
            "CASE WHEN i %% 10 = 0 THEN 1 ELSE 0 END, "
            "CASE WHEN i %% 10 = 0 THEN 'TimeoutError: slow' END, i %% 100 "
            f"FROM (SELECT seq AS i FROM seq_1_to_{claimable}) AS s",
            [],
        )
        cursor.execute("DELETE FROM django_dbworker_workerprocess")
        cursor.execute(
            "INSERT INTO django_dbworker_workerprocess (worker_id, hostname, pid, handlers, "
            "num_handlers, jobs, num_jobs, heartbeat_interval, tables, started_at, "
            "last_heartbeat_at) SELECT CONCAT('bench-', seq, ':', 1000 + seq, ':', "
            "LOWER(LPAD(HEX(seq), 6, '0'))), CONCAT('bench-', seq), 1000 + seq, %s, 4, '[]', "
            "0, 1.0, '{}', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6) "
            f"FROM seq_0_to_{WORKERS - 1}",
            [json.dumps([HANDLER])],
        )
        cursor.execute("DELETE FROM django_dbworker_jobstats")
        cursor.execute(
            "INSERT INTO django_dbworker_jobstats (minute, handler, model, worker, completed, "
            "errored, failed, canceled, requeued, lost, duration_sum, durations) "
            "SELECT UTC_TIMESTAMP() - INTERVAL SECOND(UTC_TIMESTAMP()) SECOND "
            "- INTERVAL m.seq MINUTE, %s, 'benchproject.BenchJob', CONCAT('bench-', w.seq), "
            "600 + (m.seq %% 60) * 5, m.seq %% 7, m.seq %% 3, 0, 0, 0, 60.0, "
            "'[0,0,0,0,0,100,300,150,40,10,3,1,0,0,0,0,0,0,0]' "
            "FROM seq_0_to_1439 AS m, seq_1_to_4 AS w",
            [HANDLER],
        )
        for table in (TABLE, "django_dbworker_workerprocess", "django_dbworker_jobstats"):
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()


def recreate_mariadb(name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        cursor.execute(f"USE {name}")


def pages() -> list[tuple[str, str]]:
    """(name, URL) of each page measured."""
    opts = BenchJob._meta
    changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    found = [
        ("list", changelist),
        ("list, page 100", f"{changelist}?p=100"),
        ("list state=queued", f"{changelist}?state__exact=queued"),
        ("list state=errored", f"{changelist}?state__exact=errored"),
        ("list state=completed", f"{changelist}?state__exact=completed"),
        ("list state=failed", f"{changelist}?state__exact=failed"),
        ("list due=later", f"{changelist}?due=later"),
        ("list due=now", f"{changelist}?due=now"),
        ("list heartbeat=stalled", f"{changelist}?heartbeat=stalled"),
        ("list cancel requested", f"{changelist}?cancel_requested=yes"),
        ("list worker", f"{changelist}?worker={worker_id(3)}"),
        ("list search id", f"{changelist}?q=4242"),
    ]
    model_admin = admin.site._registry[BenchJob]
    if model_admin.date_hierarchy:
        found.append(("list date hierarchy", f"{changelist}?queued_at__year=2026"))
    try:
        dashboard = reverse(f"admin:{opts.app_label}_{opts.model_name}_dashboard")
        found.append(("dashboard", dashboard))
    except NoReverseMatch:
        pass
    ids = {
        "completed": 1000,
        "failed": 98,  # i % 100 == 98: failed, with a history entry
        "queued": BenchJob.objects.filter(state="queued")
        .order_by("-pk")
        .values_list("pk", flat=True)[0],
    }
    for state, pk in ids.items():
        found.append(
            (
                f"job page ({state})",
                reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[pk]),
            )
        )
    return found


def measure(client: Client, url: str, reps: int) -> dict[str, Any]:
    client.get(url)  # warm-up: templates, caches
    times, queries, sql_ms = [], 0, []
    for _ in range(reps):
        with CaptureQueriesContext(connection) as captured:
            start = time.perf_counter()
            response = client.get(url)
            times.append(time.perf_counter() - start)
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code}")
        queries = len(captured.captured_queries)
        sql_ms.append(sum(float(q["time"]) for q in captured.captured_queries) * 1000)
    return {
        "url": url,
        "ms": round(statistics.median(times) * 1000, 1),
        "sql_ms": round(statistics.median(sql_ms), 1),
        "queries": queries,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--claimable", type=int, default=100_000)
    parser.add_argument(
        "--waiting", type=int, default=0, help="jobs queued for tomorrow, and retries (PostgreSQL)"
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="reuse a filled database")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    base = os.environ["BENCH_DATABASE_URL"].rsplit("/", 1)[0]
    name = settings.DATABASES["default"]["NAME"]
    if not name.startswith("dbworker_admin"):
        raise SystemExit(f"refusing to recreate database {name!r}: name it dbworker_admin…")
    filled = False
    if args.keep:
        try:
            filled = BenchJob.objects.order_by("-pk").values_list("pk", flat=True)[:1][0] >= (
                args.rows
            )
        except Exception:
            filled = False
    connection.close()
    mariadb = connection.vendor == "mysql"
    if not filled and mariadb:
        settings.DATABASES["default"]["NAME"] = ""
        recreate_mariadb(name)
        connection.close()
        settings.DATABASES["default"]["NAME"] = name
    elif not filled:
        recreate_database(base, name)
    call_command("migrate", verbosity=0)
    if not filled:
        started = time.monotonic()
        if mariadb:
            fill_mariadb(args.rows, args.claimable)
        else:
            fill(args.rows, args.claimable, args.waiting)
        print(f"filled {args.rows} rows in {time.monotonic() - started:.0f} s", file=sys.stderr)

    setup_test_environment()
    user_model = get_user_model()
    user = user_model.objects.filter(
        username="bench"
    ).first() or user_model.objects.create_superuser("bench", "bench@example.com", "unused")
    client = Client()
    client.force_login(user)
    results = {name: measure(client, url, args.reps) for name, url in pages()}
    print(f"{'page':28} {'ms':>8} {'sql ms':>8} {'queries':>8}")
    for page, r in results.items():
        print(f"{page:28} {r['ms']:8.1f} {r['sql_ms']:8.1f} {r['queries']:8d}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(
                {
                    "rows": args.rows,
                    "claimable": args.claimable,
                    "waiting": args.waiting,
                    "pages": results,
                },
                out,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
