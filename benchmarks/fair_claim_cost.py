"""The fair claim statement against the ordered one on any supported database (SQLite,
MariaDB, PostgreSQL), behind one tenant's backlog: ``benchmarks.fairness`` drains on
PostgreSQL only.

    DATABASE_URL=... python -m django migrate --settings tests.settings
    DATABASE_URL=... DJANGO_SETTINGS_MODULE=tests.settings \\
        python -m benchmarks.fair_claim_cost [--backlog 100000] [--batch 4] [--claims 50]

Fills ``tests.testapp.TenantJob`` (it has ``fair_index("tenant")``; its rows are
deleted before and after) with ``--backlog`` jobs of tenant 1 and 100 each of tenants 2
and 3, then times each claim statement of ``--batch`` rows, ``--claims`` times each in
blocks of 10, interleaved, each batch completed. Prints the medians in ms as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.db import connection  # noqa: E402

from django_dbworker.sql.connection import Connection  # noqa: E402
from django_dbworker.sql.fair import FairClaims  # noqa: E402
from django_dbworker.sql.jobs import statements_for  # noqa: E402
from tests.testapp.models import TenantJob  # noqa: E402

WORKER = "fair-cost:1:a"


def fill(backlog: int) -> None:
    TenantJob.objects.all().delete()
    for tenant, size in ((1, backlog), (2, 100), (3, 100)):
        TenantJob.objects.bulk_create((TenantJob(tenant=tenant) for _ in range(size)), 5000)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--claims", type=int, default=50)
    args = parser.parse_args(argv)
    fill(args.backlog)
    stmts = statements_for(TenantJob, connection.vendor, "default")
    order = stmts.order_by(("pk",))
    fair = FairClaims(stmts, "tenant", order, ("", {}), "testapp_tenantjob_fair")
    conn = Connection("default", "fair-cost")
    params: dict[str, Any] = {"worker": WORKER, "max_retries": 0, "held": stmts.ids_param([])}
    params["limit"] = args.batch

    def claim(kind: str) -> list[Any]:
        if kind == "ordered":
            return conn.execute(stmts.claim(order, limit=args.batch, max_retries=0), params)
        if stmts.dialect.update_returning:
            return conn.execute(fair.claim("", None, None, args.batch, 0, False), params)
        sql, pick = fair.pick("", None, None, args.batch, False)  # MariaDB
        return conn.execute_locked((0, 0), sql, params, lambda rows: [], pick)

    times: dict[str, list[float]] = {"ordered": [], "fair": []}
    try:
        for _ in range(max(args.claims // 10, 1)):
            for kind, measured in times.items():
                for _ in range(10):
                    started = time.perf_counter()
                    rows = claim(kind)
                    measured.append(time.perf_counter() - started)
                    ids = stmts.ids_param([row[stmts.rows.pk_index] for row in rows])
                    conn.execute(stmts.complete, {"ids": ids, "worker": WORKER})
    finally:
        conn.close()
        TenantJob.objects.all().delete()
    result = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(json.dumps({"vendor": connection.vendor, "options": vars(args), "claim_ms": result}))


if __name__ == "__main__":
    main(sys.argv[1:])
