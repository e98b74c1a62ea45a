"""The fair claim's plan on PostgreSQL (issue 43, item 2): behind a backlog of one
tenant, it reads the fair index one probe per tenant and a few rows of each, never the
backlog, and its generic plan (what a prepared claim keeps) does the same.

``DBWORKER_PLANS_ROWS`` sizes the backlog as in tests/test_plans.py (100,000 here).
"""

import json
import os

import pytest
from django.db import connection, transaction

from django_dbworker.sql.fair import FairClaims
from django_dbworker.sql.jobs import statements_for
from tests.testapp.models import TenantJob

from .test_plans import nodes, prepared

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans"),
]

ROWS = int(os.environ.get("DBWORKER_PLANS_ROWS", "100000"))
TABLE = TenantJob._meta.db_table
PARAMS = {"worker": "plans:1:aaaaaa", "held": "{1,2,3}", "dbw_fair": '[["2", 3.0]]'}


def fill():
    """``ROWS`` finished jobs, a backlog of ``ROWS`` of tenant 1, then 100 jobs each of
    tenants 2 and 3, and 16 of tenant 1 running."""
    insert = (
        f"INSERT INTO {TABLE} (state, queued_at, worker_hostname, behavior, payload, tenant, "
        "num_failures, num_resets, cancel, execution_logs, history) SELECT %s, now(), "
        "'old', 'ok', '{}', %s, 0, 0, false, '[]', '[]' FROM generate_series(1, %s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(insert, ["completed", 1, ROWS])
        cursor.execute(insert, ["queued", 1, ROWS])
        cursor.execute(insert, ["queued", 2, 100])
        cursor.execute(insert, ["queued", 3, 100])
        cursor.execute(insert, ["processing", 1, 16])
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


@pytest.mark.parametrize("weighted", [False, True], ids=["even", "weighted"])
def test_the_fair_claim_reads_a_few_rows_per_tenant_not_the_backlog(weighted):
    fill()
    stmts = statements_for(TenantJob, "postgresql", "default")
    fair = FairClaims(stmts, "tenant", stmts.order_by(("pk",)), ("", {}))
    sql = fair.claim("", None, None, 16, 3, weighted)
    with connection.cursor() as cursor:
        execute = prepared_with(cursor, "dbw_fair_claim", sql)
        for mode in ("force_custom_plan", "force_generic_plan"):
            cursor.execute(f"SET plan_cache_mode = {mode}")
            with transaction.atomic():
                cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {execute}")
                raw = cursor.fetchone()[0]
                transaction.set_rollback(True)
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
            found, text = list(nodes(plan)), json.dumps(plan, indent=1)
            assert not any(n["Node Type"] == "Seq Scan" for n in found), text
            indexes = {n.get("Index Name") for n in found}
            assert "testapp_tenantjob_fair" in indexes, text
            # Three tenants: a probe each, a few rows each; never the backlog.
            read = max(n["Actual Rows"] * n.get("Actual Loops", 1) for n in found)
            assert read < 200, text
            if weighted:
                # Tenant 1 runs 16 already: the claim goes to tenants 2 (weight 3) and 3.
                pass
        cursor.execute("RESET plan_cache_mode")


def prepared_with(cursor, name, sql):
    import tests.test_plans as plans

    saved = dict(plans.PARAMS)
    plans.PARAMS.update(PARAMS)
    try:
        return prepared(cursor, name, sql)
    finally:
        plans.PARAMS.clear()
        plans.PARAMS.update(saved)
