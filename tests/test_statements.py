"""Every bookkeeping statement against the real database: transitions and guards."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import JSONField, Value
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_dbworker.sql.connection import Connection
from django_dbworker.sql.jobs import HISTORY_LENGTH, HISTORY_MESSAGE_LENGTH, statements_for
from tests.factories import JobFactory
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db(transaction=True)

ME = "host:1:aaaaaa"
OTHER = "host:2:bbbbbb"


@pytest.fixture
def db():
    conn = Connection("default", "test")
    yield conn
    conn.close()


@pytest.fixture
def sql():
    return statements_for(QueueJob, connection.vendor, "default")


def claim(
    db, sql, limit=10, worker=ME, held=(), max_retries=0, ordering=("pk",), where="", params=None
):
    rows = db.execute(
        sql.claim(sql.order_by(ordering), where),
        {
            **(params or {}),
            "worker": worker,
            "max_retries": max_retries,
            "held": sql.ids_param(list(held)),
            "limit": limit,
        },
    )
    return sql.rows.build(rows, "default", connection)


def stage(db, sql):
    """What a worker's stager does: the keys of the rows that waited for a time and came
    due, now claimable."""
    return sorted(sql.keys(db.execute(sql.stage)))


def error_params(non_retryable, max_retries, message, delay, pk, worker):
    return {
        "non_retryable": non_retryable,
        "max_retries": max_retries,
        "message": message,
        "delay": float(delay) if delay else None,  # as the completer sends it
        "pk": pk,
        "worker": worker,
    }


def reset_params(sql, age, resets, spare=(), holders=()):
    return {
        **sql.holders_params(list(holders)),
        "age": age,
        "resets": resets,
        "spare": sql.ids_param(list(spare)),
    }


def test_claim_marks_processing_and_clears_the_previous_attempt(db, sql):
    job = JobFactory(failure_message="old", execution_logs=[{"key": "old"}])
    QueueJob.objects.filter(pk=job.pk).update(finished_at=timezone.now())
    [claimed] = claim(db, sql)
    assert claimed.pk == job.pk
    assert claimed.state == "processing"
    assert claimed.worker_hostname == ME
    assert claimed.started_at is not None
    assert claimed.last_heartbeat_at is not None
    assert claimed.finished_at is None
    assert claimed.failure_message is None
    assert claimed.execution_logs == []
    job.refresh_from_db()
    assert job.state == "processing"
    assert job.payload == {}  # instances built from the returned row carry every column
    assert claimed.payload == {}
    assert claimed.behavior == "ok"


@pytest.mark.parametrize("payload", [{}, [], None, {"a": [1, {"b": None}]}, "[]", 0])
def test_claimed_json_values_are_what_the_orm_reads_and_not_shared(db, sql, payload):
    stored = Value(None, JSONField()) if payload is None else payload  # JSON null
    JobFactory(payload=stored)
    JobFactory(payload=stored)
    first, second = claim(db, sql)
    assert first.payload == payload == QueueJob.objects.get(pk=first.pk).payload
    if isinstance(payload, (list, dict)):
        assert first.payload is not second.payload  # each instance may change its own


def test_claim_respects_limit_order_and_held_ids(db, sql):
    jobs = JobFactory.create_batch(5)
    assert sorted(j.pk for j in claim(db, sql, limit=2)) == [jobs[0].pk, jobs[1].pk]
    # Held ids are never claimed again, even when they are back in queued.
    QueueJob.objects.filter(pk=jobs[0].pk).update(state="queued")
    got = claim(db, sql, limit=10, held=[jobs[0].pk])
    assert sorted(j.pk for j in got) == [j.pk for j in jobs[2:]]
    assert [j.pk for j in claim(db, sql)] == [jobs[0].pk]  # no longer held: claimable


def candidates_read(model, ordering):
    """The rows MariaDB reads for the candidates of a claim of ``model`` in ``ordering``
    (``ANALYZE``: counted, not estimated)."""
    import json

    from django_dbworker.sql.mysql_script import KEYS, ranked_pick, script

    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE TABLE {model._meta.db_table}")
        cursor.fetchall()
    stmts = statements_for(model, connection.vendor, "default")
    statement = stmts.claim(stmts.order_by(ordering), "")
    candidates = ranked_pick(script(statement).pick).candidates.replace(KEYS, "56")
    params = {"worker": ME, "max_retries": 3, "held": stmts.ids_param([]), "limit": 10}
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE FORMAT=JSON {candidates}", params)
        plan = json.loads(cursor.fetchone()[0])

    def rows_read(node):
        if isinstance(node, dict):
            own = (node.get("r_rows") or 0) if "table_name" in node else 0
            return own + sum(rows_read(v) for v in node.values())
        if isinstance(node, list):
            return sum(rows_read(v) for v in node)
        return 0

    return rows_read(plan), json.dumps(plan, indent=1)


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB's plan of a claim")
def test_a_claim_on_mariadb_reads_no_finished_job(db, sql):
    """MariaDB has no partial dequeue index: a claim's candidates are read per state
    through the state index (``mysql_script.ranked_pick``), never through the primary key from
    the lowest key, past every finished job below the claimable ones."""
    # A fifth claimable, all above the finished jobs (as in a long-lived table): reading
    # in key order looked the cheaper plan to MariaDB, and read every finished job.
    QueueJob.objects.bulk_create(QueueJob(state="completed") for _ in range(3000))
    QueueJob.objects.bulk_create(QueueJob() for _ in range(700))
    JobFactory.create_batch(2, state="errored", num_failures=1)
    read, plan = candidates_read(QueueJob, ("pk",))
    assert 56 <= read < 300, plan
    assert len(claim(db, sql, max_retries=3)) == 10


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB's dequeue indexes")
def test_a_priority_claim_on_mariadb_reads_its_dequeue_index_state_first():
    """``dequeue_index("-priority", "id")`` is made ``(state, process_after, priority
    DESC, id)`` where indexes take no condition (``DequeueIndex``), and
    ``add_state_to_dequeue_indexes`` makes one created without the state again: a
    claim in priority order then reads its candidates from it, not a sort of every
    claimable job nor a walk past the finished ones."""
    from django.db import models

    from django_dbworker.indexes import add_state_to_dequeue_indexes
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp.models import PropertyJob

    def columns(model, name):
        with connection.cursor() as cursor:
            found = connection.introspection.get_constraints(cursor, model._meta.db_table)
        return found[name]["columns"]

    # The tasks app's migration 0011 made its index again, state first.
    assert columns(TaskJob, "dbworker_task_kind_dq")[0] == "state"
    # An index created without the state, as Django made it before DequeueIndex.
    [declared] = [i for i in PropertyJob._meta.indexes if i.name == "testapp_propjob_prio_dq"]
    plain = models.Index(fields=["-priority", "id"], name=declared.name)
    with connection.schema_editor() as editor:
        editor.remove_index(PropertyJob, declared)
        editor.add_index(PropertyJob, plain)
    assert columns(PropertyJob, declared.name) == ["priority", "id"]
    with connection.schema_editor() as editor:
        assert add_state_to_dequeue_indexes(PropertyJob, editor) == [declared.name]
        assert add_state_to_dequeue_indexes(PropertyJob, editor) == []
    assert columns(PropertyJob, declared.name) == ["state", "process_after", "priority", "id"]

    # Finished jobs first in priority order: an index without the state walks past them;
    # the index on the state alone sorts every queued job.
    PropertyJob.objects.bulk_create(PropertyJob(state="completed", priority=9) for _ in range(3000))
    PropertyJob.objects.bulk_create(PropertyJob(priority=i % 7) for i in range(3000))
    read, plan = candidates_read(PropertyJob, ("-priority", "id"))
    assert 56 <= read < 300, plan


def test_claim_order_follows_handler_ordering(db, sql):
    low = JobFactory(priority=0)
    high = JobFactory(priority=10)
    mid = JobFactory(priority=5)
    got = [claim(db, sql, limit=1, ordering=("-priority", "id"))[0].pk for _ in range(3)]
    assert got == [high.pk, mid.pk, low.pk]


def test_claim_skips_scheduled_jobs_until_their_time(db, sql):
    later = JobFactory(process_after=timezone.now() + timedelta(hours=1))
    due = JobFactory(process_after=timezone.now() - timedelta(seconds=1))
    assert claim(db, sql) == []  # a job that waits for a time is staged first
    assert stage(db, sql) == [due.pk]
    assert [j.pk for j in claim(db, sql)] == [due.pk]
    QueueJob.objects.filter(pk=later.pk).update(process_after=timezone.now())
    assert stage(db, sql) == [later.pk]
    assert [j.pk for j in claim(db, sql)] == [later.pk]


def test_errored_jobs_come_back_after_their_delay_and_within_budget(db, sql):
    waiting = JobFactory(
        state="errored", num_failures=1, process_after=timezone.now() + timedelta(hours=1)
    )
    due = JobFactory(state="errored", num_failures=1, process_after=timezone.now())
    spent = JobFactory(state="errored", num_failures=3, process_after=timezone.now())
    assert stage(db, sql) == sorted([due.pk, spent.pk])
    assert [j.pk for j in claim(db, sql, max_retries=2)] == [due.pk]
    assert waiting.pk
    assert claim(db, sql, max_retries=2) == []


def test_final_and_processing_jobs_are_never_claimed(db, sql):
    for state in ("processing", "completed", "failed", "canceled"):
        JobFactory(state=state)
    assert claim(db, sql) == []


def test_concurrent_claimers_never_take_the_same_job(db, sql):
    total = 300
    JobFactory.create_batch(total)
    taken = []
    lock = threading.Lock()

    def claimer(n):
        conn = Connection("default", f"claimer-{n}")
        try:
            while True:
                rows = conn.execute(
                    sql.claim(sql.order_by(("pk",))),
                    {"worker": f"w{n}", "max_retries": 0, "held": sql.ids_param([]), "limit": 3},
                )
                if not rows:
                    return
                with lock:
                    taken.extend(row[0] for row in rows)
        finally:
            conn.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(taken) == total
    assert len(set(taken)) == total
    assert QueueJob.objects.filter(state="processing").count() == total


def test_completion_is_fenced_to_the_claiming_worker(db, sql):
    a, b = JobFactory.create_batch(2)
    claim(db, sql)
    assert db.execute(sql.complete, {"ids": sql.ids_param([a.pk]), "worker": OTHER}) == []
    rows = db.execute(sql.complete, {"ids": sql.ids_param([a.pk, b.pk]), "worker": ME})
    assert sorted(r[0] for r in rows) == sorted([a.pk, b.pk])
    assert set(QueueJob.objects.values_list("state", flat=True)) == {"completed"}
    # A second completion (a late duplicate) changes nothing.
    assert db.execute(sql.complete, {"ids": sql.ids_param([a.pk]), "worker": ME}) == []


def test_a_late_finisher_cannot_overwrite_a_newer_attempt(db, sql):
    job = JobFactory()
    claim(db, sql, worker=ME)
    # The resetter takes it back and another worker claims it.
    QueueJob.objects.filter(pk=job.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    db.execute(sql.reset_stalled, reset_params(sql, age=60.0, resets=5))
    claim(db, sql, worker=OTHER)
    for statement, params in [
        (sql.complete, {"ids": sql.ids_param([job.pk]), "worker": ME}),
        (sql.error, error_params(False, 3, "late", 0.0, job.pk, ME)),
        (sql.cancel, {"message": "late", "ids": sql.ids_param([job.pk]), "worker": ME}),
        (sql.requeue, {"ids": sql.ids_param([job.pk]), "worker": ME, "message": "x"}),
        (sql.heartbeat, {"ids": sql.ids_param([job.pk]), "worker": ME}),
        (sql.log_set, {"logs": '[{"key": "late"}]', "pk": job.pk, "worker": ME}),
    ]:
        assert db.execute(statement, params) == []
    job.refresh_from_db()
    assert (job.state, job.worker_hostname, job.num_resets) == ("processing", OTHER, 1)
    assert job.execution_logs == []


@pytest.mark.parametrize(
    ("num_failures", "max_retries", "non_retryable", "cancel", "state", "failures_after"),
    [
        (0, 2, False, False, "errored", 1),
        (1, 2, False, False, "errored", 2),
        (2, 2, False, False, "failed", 3),
        (0, 0, False, False, "failed", 1),
        (0, 5, True, False, "failed", 1),
        (0, 5, False, True, "canceled", 0),
    ],
)
def test_error_outcome(
    db, sql, num_failures, max_retries, non_retryable, cancel, state, failures_after
):
    job = JobFactory(num_failures=num_failures)
    claim(db, sql)
    QueueJob.objects.filter(pk=job.pk).update(cancel=cancel)
    rows = db.execute(sql.error, error_params(non_retryable, max_retries, "boom", 30.0, job.pk, ME))
    assert rows == [(state,)]
    job.refresh_from_db()
    assert job.state == state
    assert job.num_failures == failures_after
    assert job.failure_message == "boom"
    assert job.finished_at is not None
    if state == "errored":
        assert job.process_after > job.finished_at + timedelta(seconds=29)


def test_heartbeat_refreshes_held_rows_and_reports_cancel_and_missing(db, sql):
    a, b, c = JobFactory.create_batch(3)
    claim(db, sql)
    old = timezone.now() - timedelta(minutes=5)
    QueueJob.objects.update(last_heartbeat_at=old)
    QueueJob.objects.filter(pk=b.pk).update(cancel=True)
    QueueJob.objects.filter(pk=c.pk).delete()
    rows = dict(db.execute(sql.heartbeat, {"ids": sql.ids_param([a.pk, b.pk, c.pk]), "worker": ME}))
    assert {pk: bool(v) for pk, v in rows.items()} == {a.pk: False, b.pk: True}
    a.refresh_from_db()
    assert a.last_heartbeat_at > old


def test_execution_log_is_written_whole_by_its_attempt_only(db, sql):
    job = JobFactory()
    claim(db, sql)
    logs = '[{"key": "a", "out": "done"}, {"key": "b", "out": ""}]'
    assert db.execute(sql.log_set, {"logs": logs, "pk": job.pk, "worker": ME}) == [(job.pk,)]
    other = {"logs": '[{"key": "other"}]', "pk": job.pk, "worker": OTHER}
    assert db.execute(sql.log_set, other) == []
    job.refresh_from_db()
    assert job.execution_logs == [{"key": "a", "out": "done"}, {"key": "b", "out": ""}]


def test_reset_stalled_and_fail_when_the_budget_is_spent(db, sql):
    fresh, stalled, poison, mine = JobFactory.create_batch(4)
    claim(db, sql)
    old = timezone.now() - timedelta(minutes=5)
    QueueJob.objects.exclude(pk=fresh.pk).update(last_heartbeat_at=old)
    QueueJob.objects.filter(pk=poison.pk).update(num_resets=2)
    params = reset_params(sql, age=60.0, resets=2, spare=[mine.pk])
    reset = db.execute(sql.reset_stalled, params)
    failed = db.execute(sql.fail_stalled, {**params, "message": "died too often"})
    assert reset == [(stalled.pk, ME)]
    assert failed == [(poison.pk, ME)]
    states = dict(QueueJob.objects.values_list("pk", "state"))
    assert states == {
        fresh.pk: "processing",
        stalled.pk: "queued",
        poison.pk: "failed",
        mine.pk: "processing",
    }
    stalled.refresh_from_db()
    poison.refresh_from_db()
    assert (stalled.num_resets, stalled.started_at) == (1, None)
    assert (poison.num_resets, poison.failure_message) == (2, "died too often")


def test_requeue_and_cancel_outcomes(db, sql):
    a, b = JobFactory.create_batch(2)
    claim(db, sql)
    requeue = {"ids": sql.ids_param([a.pk]), "worker": ME, "message": "given back"}
    assert db.execute(sql.requeue, requeue) == [(a.pk,)]
    cancel = {"message": "stop", "ids": sql.ids_param([b.pk]), "worker": ME}
    assert db.execute(sql.cancel, cancel) == [(b.pk,)]
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.state, a.started_at, a.num_resets) == ("queued", None, 0)
    assert (b.state, b.failure_message) == ("canceled", "stop")


def test_values_travel_as_parameters(db, sql):
    """A hostile worker name or message is stored verbatim, never executed."""
    job = JobFactory()
    evil = "x'; DROP TABLE testapp_queuejob; --"
    claim(db, sql, worker=evil)
    db.execute(sql.error, error_params(False, 0, evil, 0.0, job.pk, evil))
    job.refresh_from_db()
    assert (job.worker_hostname, job.failure_message) == (evil, evil)


def test_connection_tells_a_lost_connection_from_a_failing_statement(db):
    """What the resetter's hold-back keys on: only an outage counts, not a bad statement."""
    assert db.execute("SELECT 1") == [(1,)]
    with pytest.raises(Exception):  # noqa: B017, PT011 - the driver's own error class
        db.execute("SELECT no_such_column FROM testapp_queuejob")
    assert db.lost is False
    if connection.vendor == "postgresql":
        [(pid,)] = db.execute("SELECT pg_backend_pid()")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(Exception):  # noqa: B017, PT011
            db.execute("SELECT 1")
        assert db.lost is True
    assert db.execute("SELECT 1") == [(1,)]  # reconnects
    assert db.lost is False


class LockHolder:
    """A second connection holding row locks in an open transaction (PostgreSQL,
    MariaDB)."""

    def __init__(self):
        self.conn = Connection("default", "lock-holder")
        self.table = connection.ops.quote_name(QueueJob._meta.db_table)
        self.open = False

    def lock(self, pk, mode="FOR UPDATE"):
        if not self.open:
            self.conn.execute("BEGIN")
            self.open = True
        self.conn.execute(f"SELECT id FROM {self.table} WHERE id = %s {mode}", [pk])

    def release(self):
        if self.open:
            self.conn.execute("ROLLBACK")
            self.open = False


@pytest.fixture
def other_transaction():
    if connection.vendor not in ("postgresql", "mysql"):
        pytest.skip("row locks: PostgreSQL and MariaDB only")
    holder = LockHolder()
    yield holder
    holder.release()
    holder.conn.close()


def test_a_key_share_lock_blocks_neither_claims_nor_heartbeats(db, sql, other_transaction):
    """FOR KEY SHARE is what inserting a row that references a job takes."""
    if connection.vendor != "postgresql":
        pytest.skip("FOR KEY SHARE: PostgreSQL only")
    running, queued = JobFactory.create_batch(2)
    claim(db, sql, limit=1)
    other_transaction.lock(queued.pk, "FOR KEY SHARE")
    other_transaction.lock(running.pk, "FOR KEY SHARE")
    assert [j.pk for j in claim(db, sql)] == [queued.pk]
    beat = {"ids": sql.ids_param([running.pk]), "worker": ME}
    assert [r[0] for r in db.execute(sql.heartbeat, beat)] == [running.pk]


def test_outcomes_skip_rows_another_transaction_locks(db, sql, other_transaction):
    locked, free = JobFactory.create_batch(2)
    claim(db, sql)
    other_transaction.lock(locked.pk)
    both = {"ids": sql.ids_param([locked.pk, free.pk]), "worker": ME}
    assert db.execute(sql.complete, both) == [(free.pk,)]  # no wait
    assert db.execute(sql.error, error_params(False, 0, "x", 0.0, locked.pk, ME)) == []
    one = {"ids": sql.ids_param([locked.pk]), "worker": ME}
    assert db.execute(sql.still_held, one) == [(locked.pk, False)]


def test_resetter_spares_a_stalled_row_it_found_locked_for_stalled_max_age(other_transaction):
    from django_dbworker.maintenance.resetter import Resetter
    from tests.testapp.handlers import BehaviorHandler

    old = timezone.now() - timedelta(minutes=1)
    job = JobFactory(state="processing", last_heartbeat_at=old, worker_hostname=OTHER)
    resetter = Resetter([BehaviorHandler(stalled_max_age=1)])
    try:
        other_transaction.lock(job.pk)
        assert resetter.run_once()[0].reset == []  # skipped: locked
        time.sleep(0.6)
        assert resetter.run_once()[0].reset == []  # still locked: noted again
        other_transaction.release()
        # Its worker gets stalled_max_age from when the lock was last seen to beat again.
        assert resetter.run_once()[0].reset == []
        time.sleep(1.1)
        assert resetter.run_once()[0].reset == [job.pk]
    finally:
        resetter.close()


# -- attempt history -----------------------------------------------------------------


def test_attempts_that_end_without_completing_are_kept_in_history(db, sql):
    """Each statement that ends an attempt other than by completing appends one entry:
    the worker, times, outcome, message and the log's keys and exit codes."""
    job = JobFactory()
    logs = [{"key": "step", "command": ["x"], "exit_code": 3, "out": "lots of output"}]
    claim(db, sql, max_retries=5)
    QueueJob.objects.filter(pk=job.pk).update(execution_logs=logs)
    db.execute(sql.error, error_params(False, 5, "boom\n\ntraceback", 0.0, job.pk, ME))
    claim(db, sql, max_retries=5, worker=OTHER)
    requeue = {"ids": sql.ids_param([job.pk]), "worker": OTHER, "message": "given back"}
    db.execute(sql.requeue, requeue)
    claim(db, sql, max_retries=5)
    db.execute(sql.complete, {"ids": sql.ids_param([job.pk]), "worker": ME})
    job.refresh_from_db()
    assert job.state == "completed"
    assert [(e["outcome"], e["worker"], e["message"]) for e in job.history] == [
        ("errored", ME, "boom\n\ntraceback"),
        ("requeued", OTHER, "given back"),
    ]
    first = job.history[0]
    assert first["logs"] == [{"key": "step", "exit_code": 3}]
    assert parse_datetime(first["started_at"]) < parse_datetime(first["ended_at"])
    assert job.history[1]["logs"] == []  # the claim emptied the log


def test_history_of_cancels_resets_and_failures(db, sql):
    canceled, stalled, poison, flagged = JobFactory.create_batch(4)
    claim(db, sql)
    db.execute(sql.cancel, {"message": "stop", "ids": sql.ids_param([canceled.pk]), "worker": ME})
    QueueJob.objects.filter(pk=flagged.pk).update(cancel=True)
    db.execute(sql.error, error_params(False, 5, "failed while canceled", 0, flagged.pk, ME))
    old = timezone.now() - timedelta(minutes=5)
    QueueJob.objects.filter(pk__in=[stalled.pk, poison.pk]).update(last_heartbeat_at=old)
    QueueJob.objects.filter(pk=poison.pk).update(num_resets=3)
    params = reset_params(sql, age=60.0, resets=3)
    db.execute(sql.reset_stalled, params)
    db.execute(sql.fail_stalled, {**params, "message": "died too often"})
    outcomes = {
        j.pk: [(e["outcome"], e["message"]) for e in QueueJob.objects.get(pk=j.pk).history]
        for j in (canceled, stalled, poison, flagged)
    }
    assert outcomes == {
        canceled.pk: [("canceled", "stop")],
        stalled.pk: [("reset", "its worker stopped heartbeating")],
        poison.pk: [("failed", "died too often")],
        flagged.pk: [("canceled", "failed while canceled")],
    }
    ended = QueueJob.objects.get(pk=stalled.pk).history[0]["ended_at"]
    assert parse_datetime(ended) == old  # its last heartbeat


def test_history_keeps_the_last_entries_and_cuts_long_messages(db, sql):
    job = JobFactory(history=[{"outcome": "errored", "n": i} for i in range(HISTORY_LENGTH)])
    claim(db, sql, max_retries=100)
    db.execute(sql.error, error_params(False, 100, "y" * 10_000, 0.0, job.pk, ME))
    job.refresh_from_db()
    assert len(job.history) == HISTORY_LENGTH
    assert job.history[0]["n"] == 1  # the oldest went
    assert job.history[-1]["message"] == "y" * HISTORY_MESSAGE_LENGTH


def test_a_claim_locks_only_the_rows_it_takes(db, sql, other_transaction):
    """MariaDB: a claim whose rows InnoDB sorts after reading them kept a lock on every
    claimable row it read, so a second worker's claim, skipping them all, found nothing
    while the first one's transaction was open. It reads candidates first now."""
    if connection.vendor != "mysql":
        pytest.skip("how InnoDB locks a sorted SKIP LOCKED read")
    from django_dbworker.sql import mysql_script

    jobs = JobFactory.create_batch(8)
    other_transaction.lock(jobs[-1].pk)  # its transaction is open from here on
    raw = other_transaction.conn._raw()
    params = {"worker": OTHER, "max_retries": 0, "held": sql.ids_param([]), "limit": 3}
    # The optimizer's plan for a table this small may not sort: sort it (a filter on
    # the state index, rows ordered by another column), as a big queue's claim does.
    statement = sql.claim(sql.order_by(("-priority", "pk")))
    taken = mysql_script.run_script(raw.cursor(), raw.literal, statement, params)
    assert [row[sql.rows.pk_index] for row in taken] == [j.pk for j in jobs[:3]]
    assert [j.pk for j in claim(db, sql, limit=3, ordering=("-priority", "pk"))] == [
        j.pk for j in jobs[3:6]
    ]
