"""MariaDB: what the package runs on Django's own connection (the application's: the
operator's operations, the admin, enqueueing, the tasks backend, the testing helpers)
leaves that connection's session as the project set it, and behaves the same under
the project's settings (issue 42, item 10).

The project here runs REPEATABLE READ (``OPTIONS["isolation_level"]``), in the time
zone +05:00 and with an ``sql_mode`` of its own (``init_command``). Before the fix the
operations set READ COMMITTED, UTC and ``SIMULTANEOUS_ASSIGNMENT`` for the session,
and every later request of the project ran with them."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from django_dbworker import operations
from django_dbworker.consumers.assignment import live_workers
from django_dbworker.consumers.status import live_worker_ids
from django_dbworker.models import WorkerProcess
from django_dbworker.testing import run_jobs, run_tasks
from tests.factories import JobFactory
from tests.testapp import tasks as t
from tests.testapp.handlers import BehaviorHandler
from tests.testapp.models import QueueJob, ReportJob

pytestmark = [
    pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB's session settings"),
    pytest.mark.django_db(transaction=True),
]

#: The project's own: none of READ COMMITTED, UTC or SIMULTANEOUS_ASSIGNMENT.
ISOLATION = "REPEATABLE-READ"
ZONE = "+05:00"
MODE = "ONLY_FULL_GROUP_BY,STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION"


def session():
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.tx_isolation, @@SESSION.time_zone, @@SESSION.sql_mode")
        return cursor.fetchone()


@pytest.fixture
def project_session():
    """Django's connection as a project configures it; the session's values."""
    settings_dict = connection.settings_dict
    saved = settings_dict["OPTIONS"]
    connection.close()
    settings_dict["OPTIONS"] = {
        **saved,
        "isolation_level": "repeatable read",
        "init_command": f"SET time_zone = '{ZONE}', sql_mode = '{MODE}'",
    }
    try:
        values = session()
        assert values == (ISOLATION, ZONE, MODE)
        yield values
    finally:
        connection.close()
        settings_dict["OPTIONS"] = saved


def near_now(value, within=timedelta(seconds=30)):
    """``value`` is now (by this machine's clock, UTC), not hours away."""
    return value is not None and abs(value - timezone.now()) < within


def test_operator_actions_leave_the_session_and_keep_their_times(project_session):
    scheduled = JobFactory()
    later = JobFactory(process_after=timezone.now() + timedelta(days=1))
    errored = JobFactory(state="errored", num_failures=1, failure_message="boom")
    failed = JobFactory(state="failed", num_failures=3)
    running = JobFactory(state="processing", last_heartbeat_at=timezone.now())

    when = datetime(2031, 1, 2, 3, 4, tzinfo=UTC)
    assert operations.schedule(QueueJob.objects.filter(pk=scheduled.pk), when) == [scheduled.pk]
    assert session() == project_session
    assert QueueJob.objects.get(pk=scheduled.pk).process_after == when

    assert sorted(operations.run_now(QueueJob.objects.all())) == sorted([scheduled.pk, later.pk])
    assert session() == project_session
    for job in QueueJob.objects.filter(pk__in=[scheduled.pk, later.pk]):
        assert job.process_after is None  # due now
        assert near_now(job.queued_at), job.queued_at  # not five hours ahead

    result = operations.cancel(QueueJob.objects.filter(pk__in=[errored.pk, running.pk]))
    assert result == operations.Cancellation(canceled=[errored.pk], requested=[running.pk])
    assert session() == project_session
    job = QueueJob.objects.get(pk=errored.pk)
    # Each assignment read the row as it was (SIMULTANEOUS_ASSIGNMENT, for the UPDATE).
    assert job.failure_message == operations.CANCELED_AWAITING_RETRY + "boom"
    assert near_now(job.finished_at), job.finished_at

    assert operations.retry(QueueJob.objects.filter(pk=failed.pk)).retried == [failed.pk]
    assert session() == project_session
    assert near_now(QueueJob.objects.get(pk=failed.pk).queued_at)

    # Inside the project's own transaction too (its isolation level is its own).
    with transaction.atomic():
        assert operations.cancel(QueueJob.objects.filter(pk=failed.pk)).canceled == [failed.pk]
        assert session() == project_session
    assert session() == project_session

    # What run_now made due, a claim takes at once (the testing helper's claim, on the
    # same connection, leaves the session alone too).
    run = run_jobs(BehaviorHandler)
    assert sorted(run.completed) == sorted([scheduled.pk, later.pk])
    assert session() == project_session


def test_admin_pages_and_actions_leave_the_session(project_session, admin_client):
    errored = JobFactory(state="errored", failure_message="boom")
    later = JobFactory(process_after=timezone.now() + timedelta(days=1))
    changelist = reverse("admin:testapp_queuejob_changelist")

    page = reverse("admin:testapp_queuejob_change", args=[later.pk])
    assert admin_client.get(changelist).status_code == 200
    assert admin_client.get(page).status_code == 200
    response = admin_client.post(
        changelist, {"action": "run_now", "_selected_action": [later.pk]}, follow=True
    )
    assert response.status_code == 200
    made_due = QueueJob.objects.get(pk=later.pk)
    assert made_due.process_after is None  # due now: claimable, off the waiting index
    assert near_now(made_due.queued_at)
    response = admin_client.post(
        changelist, {"action": "cancel_jobs", "_selected_action": [errored.pk]}, follow=True
    )
    assert response.status_code == 200
    assert QueueJob.objects.get(pk=errored.pk).state == "canceled"
    assert admin_client.get(reverse("admin:index")).status_code == 200
    assert session() == project_session


def test_enqueueing_and_results_leave_the_session_and_keep_their_times(project_session):
    assert QueueJob.objects.bulk_enqueue([{"behavior": "ok"}, {"behavior": "ok"}]) == 2
    assert session() == project_session
    for job in QueueJob.objects.all():
        assert near_now(job.queued_at), job.queued_at  # the database's default, in UTC

    first, created = ReportJob.objects.enqueue_unique(tenant="a")
    again, created_again = ReportJob.objects.enqueue_unique(tenant="a")
    assert (created, created_again, again.pk) == (True, False, first.pk)
    assert session() == project_session

    result = t.add.enqueue(1, 2)
    assert run_tasks().completed
    result.refresh()
    assert result.return_value == 3
    assert t.add.get_result(result.id).return_value == 3
    assert session() == project_session


def test_consumer_leases_and_statuses_read_heartbeats_in_utc(project_session):
    """A worker process's own Django connections carry the project's settings too: the
    consumers' leases compare the registry's heartbeats (the workers' clock, in UTC)
    with the database's now. At +05:00 ``Now()`` made every live worker look dead
    (at -05:00 a dead one live for five hours)."""
    now = timezone.now()
    WorkerProcess.objects.create(
        worker_id="live:1:a",
        hostname="live",
        pid=1,
        handlers=["consumer:orders"],
        started_at=now,
        last_heartbeat_at=now,
    )
    WorkerProcess.objects.create(
        worker_id="gone:2:b",
        hostname="gone",
        pid=2,
        handlers=["consumer:orders"],
        started_at=now - timedelta(hours=2),
        last_heartbeat_at=now - timedelta(minutes=10),
    )
    assert live_worker_ids("default", lease=60) == {"live:1:a"}
    assert live_workers("default", lease=60) == {"orders": ["live:1:a"]}
    assert session() == project_session
