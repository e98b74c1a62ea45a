"""PostgreSQL plans a prepared claim once and keeps that plan (a generic plan), and the
generic plan is the right one on a large table: it reads the dequeue index, never the
whole table, with a million finished rows and with a backlog of a million.

``DBWORKER_PLANS_ROWS=10000000`` runs it at ten million rows (docs/benchmarks.md).
"""

import json
import os
import re

import pytest
from django.db import connection

from django_dbworker.sql.jobs import statements_for
from tests.testapp.models import QueueJob

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan cache"),
]

ROWS = int(os.environ.get("DBWORKER_PLANS_ROWS", "1000000"))
TABLE = QueueJob._meta.db_table
PARAMS = {
    "worker": "plans:1:aaaaaa",
    "max_retries": 3,
    "held": "{1,2,3}",
    "ids": "{4,5}",
    "spare": "{6}",
    "age": 5.0,
    "resets": 3,
    **{f"holders_{name}": "{}" for name in ("workers", "ages", "resets")},
}


def fill(finished, queued, scheduled=0, retrying=0):
    """``finished`` completed rows (the older ids), ``scheduled`` queued ones for
    tomorrow, ``retrying`` errored ones whose retry is tomorrow, then ``queued`` queued
    ones due now."""
    insert = (
        f"INSERT INTO {TABLE} (state, queued_at, started_at, finished_at, worker_hostname, "
        "behavior, payload, priority, size, num_failures, process_after) SELECT %s, now(), "
        "now(), now(), 'old', 'ok', '{}', n %% 7, 1, %s, now() + make_interval(days => %s) "
        "FROM generate_series(1, %s) AS n"
    )
    with connection.cursor() as cursor:
        cursor.execute(insert, ["completed", 0, None, finished])
        cursor.execute(insert, ["queued", 0, 1, scheduled])
        cursor.execute(insert, ["errored", 1, 1, retrying])
        cursor.execute(insert, ["queued", 0, None, queued])
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


def prepared(cursor, name, sql):
    """PREPARE ``sql`` (named parameters) as ``name``; its EXECUTE with ``PARAMS``."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
    for number, key in enumerate(names, 1):
        sql = sql.replace(f"%({key})s", f"${number}")
    cursor.execute(f"PREPARE {name} AS {sql}")
    values = ", ".join(f"'{PARAMS[key]}'" for key in names)
    return f"EXECUTE {name}({values})" if names else f"EXECUTE {name}"


def nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def generic_plan(cursor, execute):
    cursor.execute("SET plan_cache_mode = force_generic_plan")
    try:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {execute}")
        raw = cursor.fetchone()[0]
    finally:
        cursor.execute("RESET plan_cache_mode")
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return list(nodes(plan)), json.dumps(plan, indent=1)


@pytest.mark.parametrize(
    ("finished", "queued", "waiting"),
    [
        pytest.param(ROWS, 1_000, 0, id="finished"),
        pytest.param(0, ROWS, 0, id="backlog"),
        # Jobs for later (issue 43): scheduled for tomorrow, retries due tomorrow.
        pytest.param(0, 1_000, ROWS, id="waiting"),
    ],
)
def test_claims_keep_generic_plans_that_read_the_dequeue_index(finished, queued, waiting):
    fill(finished, queued, scheduled=waiting, retrying=waiting)
    stmts = statements_for(QueueJob, "postgresql", "default")
    orderings = {("pk",): "testapp_queuejob_dq", ("-priority", "id"): "testapp_queuejob_prio_dq"}
    with connection.cursor() as cursor:
        for number, (ordering, index) in enumerate(orderings.items()):
            name = f"dbw_claim_{number}"
            execute = prepared(
                cursor, name, stmts.claim(stmts.order_by(ordering), limit=64, max_retries=3)
            )
            found, text = generic_plan(cursor, execute)
            scans = {(n["Node Type"], n.get("Index Name")) for n in found if n.get("Relation Name")}
            assert ("Index Scan", f"{TABLE}_pkey") in scans, text
            assert not any(n["Node Type"] == "Seq Scan" for n in found), text
            if waiting:
                # A short queue behind a million jobs for later: read from a dequeue
                # index, which holds none of those (sorted if it is the other one).
                assert scans & {("Index Scan", i) for i in orderings.values()}, text
            if queued == ROWS:
                # A backlog: its head in claim order, from the dequeue index. The one
                # sort: the 64 rows claimed, into claim order. (A short queue may be
                # read from the state index and sorted.)
                assert ("Index Scan", index) in scans, text
                assert not any(n["Node Type"] == "Sort" for n in found[1:]), text

            # As PostgreSQL plans by default: a custom plan for each of the first five
            # executions, then the generic one, kept (one more: the EXPLAIN's).
            for _ in range(8):
                cursor.execute(execute)
            cursor.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s",
                [name],
            )
            assert cursor.fetchone() == (3 + 1, 5)

        # Outcomes and heartbeats (rows by key), the resetter (the rows being processed,
        # from the state index).
        held = (
            stmts.complete,
            stmts.heartbeat,
            stmts.still_held,
            stmts.reset_stalled,
            stmts.stage,
            stmts.next_due,
        )
        for number, sql in enumerate(held):
            found, text = generic_plan(cursor, prepared(cursor, f"dbw_{number}", sql))
            assert not any(n["Node Type"] == "Seq Scan" for n in found), text
            if waiting and sql in (stmts.stage, stmts.next_due):
                # The first waiting rows by time, from the waiting index: never all of them.
                indexes = {n.get("Index Name") for n in found if "Index" in n["Node Type"]}
                assert "testapp_queuejob_wt" in indexes, text
        cursor.execute("DEALLOCATE ALL")
