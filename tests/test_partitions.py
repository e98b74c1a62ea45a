"""Partitioned job tables (django_dbworker.partitions, PostgreSQL): jobs move to their
day's partition when they finish, retention drops a day's partition whole instead of
deleting its rows, and the claims, the operator's operations, unique keys and the admin
work on the partitioned table (tests/testapp PartJob, migration 0022)."""

import datetime
import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.urls import reverse
from django.utils import timezone

from django_dbworker import operations
from django_dbworker.checks import validate_handler
from django_dbworker.maintenance.retention import Retention
from django_dbworker.partitions import ACTIVE_DAY, partition_table, unpartition_table
from django_dbworker.sql import partitions as sql
from tests.conftest import wait_until
from tests.testapp import handlers as h
from tests.testapp.models import PartJob

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="declarative partitioning: PostgreSQL only"
)
TABLE = PartJob._meta.db_table


@pytest.fixture(autouse=True)
def _as_migrated():
    """Leave the table's partitions as migration 0022 made them: the flush after a test
    empties them but keeps the old days' partitions a test made."""
    yield
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for partition in sql.partitions(cursor, TABLE):
            if partition.day is not None and partition.day < today():
                cursor.execute(sql.drop(partition.name))
        for day in sql.days_to_make(today(), 3):
            cursor.execute(sql.create_day(TABLE, day))


def where():
    """{job id: the partition its row is in}."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, tableoid::regclass::text FROM {TABLE}")
        return dict(cursor.fetchall())


def partition_names():
    with connection.cursor() as cursor:
        return {p.name for p in sql.partitions(cursor, TABLE)}


def today():
    return datetime.datetime.now(datetime.UTC).date()


def old_day(days):
    """A day ``days`` ago with a partition of its own (made here, as a pass would have)."""
    day = today() - datetime.timedelta(days=days)
    with connection.cursor() as cursor:
        cursor.execute(sql.create_day(TABLE, day))
    return day


def finished_on(day, hour=12):
    return datetime.datetime.combine(day, datetime.time(hour), datetime.UTC)


@postgresql_only
def test_jobs_move_to_the_partition_of_the_day_they_finish(run_worker):
    ok = PartJob.objects.create(behavior="ok")
    failed = PartJob.objects.create(behavior="nonretryable")
    retrying = PartJob.objects.create(behavior="fail_times", payload={"times": 5})
    later = PartJob.objects.create(process_after=timezone.now() + datetime.timedelta(hours=1))
    active = sql.partition_name(TABLE, "_active")
    assert set(where().values()) == {active}
    tw = run_worker(h.PartHandler())
    wait_until(
        lambda: (
            PartJob.objects.filter(state__in=("completed", "failed")).count() == 2
            and PartJob.objects.get(pk=retrying.pk).num_failures >= 1
        ),
        message="the outcomes",
    )
    assert tw.stop() == 0
    day = sql.day_name(TABLE, today())
    rows = where()
    assert (rows[ok.pk], rows[failed.pk]) == (day, day)
    assert (rows[retrying.pk], rows[later.pk]) == (active, active)  # errored, queued: active
    assert PartJob.objects.get(pk=ok.pk).finished_on == today()
    assert PartJob.objects.get(pk=later.pk).finished_on == ACTIVE_DAY


@postgresql_only
def test_retention_drops_a_day_partition_instead_of_deleting_its_rows(caplog):
    """A day's finished jobs go with their partition (the pass deletes no row of theirs);
    active jobs, today's finished ones and the default partition's stay or go row by
    row as their own retention says."""
    day = old_day(5)
    old = PartJob.objects.bulk_create(
        PartJob(state=state, finished_at=finished_on(day)) for state in ["completed"] * 150
    )
    old += [PartJob.objects.create(state="failed", finished_at=finished_on(day))]
    assert set(
        PartJob.objects.filter(pk__in=[j.pk for j in old]).values_list("finished_on", flat=True)
    ) == {day}
    queued = PartJob.objects.create()  # an active job, queued long ago
    PartJob.objects.filter(pk=queued.pk).update(queued_at=finished_on(day))
    fresh = PartJob.objects.create(state="completed", finished_at=timezone.now())
    # A day without a partition (none made ahead then): its jobs are in the default one.
    stray_day = today() - datetime.timedelta(days=9)
    stray = PartJob.objects.create(state="canceled", finished_at=finished_on(stray_day))
    assert where()[stray.pk] == sql.partition_name(TABLE, "_default")
    name = sql.day_name(TABLE, day)
    assert name in partition_names()

    retention = Retention([h.PartHandler()])
    deleted = retention.run_once(budget=30)
    retention.close()

    assert name not in partition_names()
    assert not PartJob.objects.filter(pk__in=[j.pk for j in old]).exists()
    # Rows deleted one by one: the stray only (the 151 went with their partition).
    assert deleted == {h.PartHandler().get_name(): 1}
    assert set(PartJob.objects.values_list("pk", flat=True)) == {queued.pk, fresh.pk}
    said = [r.getMessage() for r in caplog.records if "dropped partition" in r.getMessage()]
    assert len(said) == 1
    assert name in said[0]
    # The partitions of the days ahead were there, or are now.
    ahead = {sql.day_name(TABLE, d) for d in sql.days_to_make(today(), 3)}
    assert ahead <= partition_names()


@postgresql_only
def test_a_partition_stays_while_a_handler_keeps_some_of_its_jobs():
    """A handler that keeps failed jobs for ever: no partition is dropped, and completed
    jobs past retention are deleted row by row (as on any table)."""

    class KeepsFailures(h.PartHandler):
        retention = {"completed": datetime.timedelta(days=2)}

    day = old_day(6)
    completed = PartJob.objects.create(state="completed", finished_at=finished_on(day))
    failed = PartJob.objects.create(state="failed", finished_at=finished_on(day))
    retention = Retention([KeepsFailures()])
    assert retention.run_once(budget=30) == {KeepsFailures().get_name(): 1}
    retention.close()
    assert sql.day_name(TABLE, day) in partition_names()
    assert list(PartJob.objects.values_list("pk", flat=True)) == [failed.pk]
    assert not PartJob.objects.filter(pk=completed.pk).exists()
    messages = {m.id for m in validate_handler(KeepsFailures)}
    assert "dbworker.W011" in messages


@postgresql_only
def test_operations_move_rows_and_wait_out_a_row_a_worker_moved():
    """The operator's cancel moves a queued job to today's partition, a retry back to the
    active one; a cancel that waited for a row a worker finished meanwhile (PostgreSQL:
    "tuple to be locked was already moved to another partition") looks at it again."""
    queued = PartJob.objects.create()
    operations.cancel(PartJob.objects.filter(pk=queued.pk))
    assert where()[queued.pk] == sql.day_name(TABLE, today())
    assert PartJob.objects.get(pk=queued.pk).finished_on == today()
    operations.retry(PartJob.objects.filter(pk=queued.pk))
    assert where()[queued.pk] == sql.partition_name(TABLE, "_active")
    assert PartJob.objects.get(pk=queued.pk).state == "queued"

    running = PartJob.objects.create(state="processing", worker_hostname="w")
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            other.set_autocommit(False)
            # What a worker's outcome does: finish the job, move its row.
            cursor.execute(
                f"UPDATE {TABLE} SET state = 'completed', finished_at = now(), "
                "finished_on = CURRENT_DATE WHERE id = %s",
                [running.pk],
            )
            result = {}

            def cancel():
                try:
                    result["done"] = operations.cancel(PartJob.objects.filter(pk=running.pk))
                except Exception as exc:  # what the operator would see
                    result["error"] = exc
                finally:
                    connection.close()

            thread = threading.Thread(target=cancel)
            thread.start()
            time.sleep(0.5)  # the cancel waits for the row's lock
            other.commit()
            thread.join(30)
    finally:
        other.close()
    assert "error" not in result, result
    assert result["done"].canceled == []
    assert result["done"].requested == []
    assert PartJob.objects.get(pk=running.pk).state == "completed"


@postgresql_only
def test_unique_keys_hold_among_active_jobs_of_a_partitioned_table(run_worker):
    first, created = PartJob.objects.enqueue_unique(key="k", behavior="nonretryable")
    assert created
    again, created = PartJob.objects.enqueue_unique(key="k")
    assert not created
    assert again.pk == first.pk
    with pytest.raises(Exception, match="testapp_partjob_key"), transaction.atomic():
        PartJob.objects.create(key="k")
    tw = run_worker(h.PartHandler())
    wait_until(lambda: PartJob.objects.get(pk=first.pk).state == "failed")
    assert tw.stop() == 0
    # Finished, in today's partition: the key is free again, and a retry of the failed
    # job (back to the active partition) finds it held.
    second, created = PartJob.objects.enqueue_unique(key="k")
    assert created
    held = operations.retry(PartJob.objects.filter(pk=first.pk)).held
    assert held == {first.pk: second.pk}


@postgresql_only
def test_the_admin_lists_and_shows_jobs_of_every_partition(admin_client):
    day = old_day(3)
    done = PartJob.objects.create(state="completed", finished_at=finished_on(day))
    queued = PartJob.objects.create(behavior="listed")
    response = admin_client.get(reverse("admin:testapp_partjob_changelist"))
    assert response.status_code == 200
    body = response.content.decode()
    assert f"/{done.pk}/change/" in body
    assert f"/{queued.pk}/change/" in body
    for job in (done, queued):
        page = admin_client.get(reverse("admin:testapp_partjob_change", args=[job.pk]))
        assert page.status_code == 200
    response = admin_client.post(
        reverse("admin:testapp_partjob_changelist"),
        {"action": "cancel_jobs", "_selected_action": [queued.pk], "index": 0},
    )
    assert response.status_code == 302
    assert PartJob.objects.get(pk=queued.pk).state == "canceled"
    assert where()[queued.pk] == sql.day_name(TABLE, today())


@postgresql_only
def test_converting_an_existing_table_keeps_its_jobs(run_worker):
    """The documented path for a table in use: its active jobs move to the active
    partition, its finished ones stay (the legacy partition, deleted row by row), and
    new ids go on after the old ones."""
    from django.db import connection as conn

    with conn.schema_editor() as editor:
        unpartition_table(PartJob, editor)
    try:
        done = PartJob.objects.create(state="completed", finished_at=timezone.now())
        queued = PartJob.objects.create()
        with conn.schema_editor() as editor:
            assert partition_table(PartJob, editor)
        rows = where()
        assert rows[done.pk] == sql.partition_name(TABLE, "_legacy")
        assert rows[queued.pk] == sql.partition_name(TABLE, "_active")
        newer = PartJob.objects.create()
        assert newer.pk > queued.pk
        tw = run_worker(h.PartHandler())
        wait_until(lambda: PartJob.objects.filter(state="completed").count() == 3)
        assert tw.stop() == 0
        assert where()[queued.pk] == sql.day_name(TABLE, today())
        # Retention empties the legacy partition row by row, then drops it.
        legacy = sql.partition_name(TABLE, "_legacy")
        retention = Retention([h.PartHandler()])
        retention.run_once(budget=30)
        assert legacy in partition_names()  # its job is not due yet
        PartJob.objects.filter(pk=done.pk).update(finished_at=finished_on(old_day(30)))
        assert retention.run_once(budget=30) == {h.PartHandler().get_name(): 1}
        retention.run_once(budget=30)
        retention.close()
        assert legacy not in partition_names()
    finally:
        with conn.schema_editor() as editor:  # as migration 0022 left it
            unpartition_table(PartJob, editor)
            PartJob.objects.all().delete()
            partition_table(PartJob, editor)


@pytest.mark.skipif(connection.vendor == "postgresql", reason="the refusal elsewhere")
def test_a_partitioned_table_is_refused_elsewhere():
    messages = validate_handler(h.PartHandler)
    assert [m.id for m in messages if m.id == "dbworker.E034"] == ["dbworker.E034"]
    assert "only PostgreSQL has" in next(m.msg for m in messages if m.id == "dbworker.E034")


@postgresql_only
def test_a_worker_statement_runs_again_when_its_row_moved_meanwhile():
    """The worker's private connections (sql.connection): a statement that waited for a
    row another transaction moved to another partition gets PostgreSQL's "already moved
    to another partition" (SQLSTATE 40001, even in READ COMMITTED) and runs again,
    finding the row where it went."""
    from django_dbworker.sql.connection import Connection

    job = PartJob.objects.create(state="processing", worker_hostname="w")
    other = connections.create_connection("default")
    conn = Connection("default", "moved")
    try:
        with other.cursor() as cursor:
            other.set_autocommit(False)
            cursor.execute(
                f"UPDATE {TABLE} SET state = 'completed', finished_at = now(), "
                "finished_on = CURRENT_DATE WHERE id = %s",
                [job.pk],
            )
            result = {}

            def touch():
                try:
                    result["rows"] = conn.execute(
                        f"UPDATE {TABLE} SET cancel = true WHERE id = %(pk)s RETURNING state",
                        {"pk": job.pk},
                    )
                except Exception as exc:
                    result["error"] = exc

            thread = threading.Thread(target=touch)
            thread.start()
            time.sleep(0.5)  # it waits for the row's lock
            other.commit()
            thread.join(30)
    finally:
        other.close()
        conn.close()
    assert "error" not in result, result
    assert result["rows"] == [("completed",)]


@postgresql_only
def test_the_worker_statements_read_the_active_partition_alone():
    """Claims, heartbeats, outcomes and the resetter name the active partition
    (``finished_on = '9999-12-31'``): PostgreSQL plans them against it alone, however
    many day partitions the table has."""
    from django_dbworker.sql.jobs import statements_for

    old_day(4)
    stmts = statements_for(PartJob, "postgresql", "default")
    keys = stmts.ids_param([1, 2])
    unknown = {**stmts.holders_params([]), "age": 1.0, "spare": stmts.ids_param([])}
    statements = {
        "claim": (
            stmts.claim(stmts.order_by(("pk",)), limit=10, max_retries=5),
            {"worker": "w", "max_retries": 5, "held": stmts.ids_param([]), "limit": 10},
        ),
        "heartbeat": (stmts.heartbeat, {"ids": keys, "worker": "w"}),
        "complete": (stmts.complete, {"ids": keys, "worker": "w"}),
        "reset_stalled": (stmts.reset_stalled, {**unknown, "resets": 5}),
        "stage": (stmts.stage, {}),
    }
    from django_dbworker.sql.connection import Connection

    conn = Connection("default", "plans")
    try:
        for name, (statement, params) in statements.items():
            plan = "\n".join(row[0] for row in conn.execute(f"EXPLAIN {statement}", params))
            read = {p for p in partition_names() if p in plan}
            assert read == {sql.partition_name(TABLE, "_active")}, (name, plan)
    finally:
        conn.close()


@postgresql_only
def test_a_day_the_default_partition_holds_jobs_of_gets_no_partition(caplog):
    """Jobs that finished on a day without a partition are in the default one; making
    that day's partition would fail (PostgreSQL), so the pass says so and goes on with
    the other days."""
    from django_dbworker.maintenance.partitions import DayPartitions

    day = today() + datetime.timedelta(days=2)
    name = sql.day_name(TABLE, day)
    with connection.cursor() as cursor:
        cursor.execute(sql.drop(name))
    stray = PartJob.objects.create(state="canceled", finished_at=finished_on(day))
    assert where()[stray.pk] == sql.partition_name(TABLE, "_default")
    DayPartitions([h.PartHandler()]).run_once()
    assert name not in partition_names()
    assert sql.day_name(TABLE, day + datetime.timedelta(days=1)) in partition_names()
    said = [r.getMessage() for r in caplog.records if "not made now" in r.getMessage()]
    assert len(said) == 1
    assert f"partition of {day} not made now" in said[0]
    PartJob.objects.filter(pk=stray.pk).delete()
    DayPartitions([h.PartHandler()]).run_once()
    assert name in partition_names()
