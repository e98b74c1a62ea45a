"""The operator's operations (``django_dbworker.operations``) on real databases."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_dbworker import operations
from django_dbworker.sql import mysql_session
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.test_notify import SlowPollHandler, idle_worker
from tests.testapp.models import ManagedJob, QueueJob

pytestmark = pytest.mark.django_db

needs_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL only (row locks, LISTEN/NOTIFY)"
)


def state_of(model, job):
    return model._base_manager.get(pk=job.pk).state


def managed(**fields):
    return ManagedJob._base_manager.create(**fields)


# -- any queryset of a job model -------------------------------------------------------


def test_operations_work_on_a_default_manager_of_the_users_own():
    """ManagedJob's default manager returns a plain QuerySet (no ``cancel()``), its
    table and two of its columns have names that need quoting."""
    queued, running = managed(), managed(state="processing")
    failed, hidden = managed(state="failed", num_failures=3), managed(hidden=True)
    later = managed(process_after=timezone.now() + timedelta(hours=1))
    assert not hasattr(ManagedJob.objects.all(), "cancel")

    result = operations.cancel(ManagedJob.objects.filter(pk__in=[queued.pk, running.pk]))
    assert result == operations.Cancellation(canceled=[queued.pk], requested=[running.pk])
    assert ManagedJob.objects.get(pk=running.pk).cancel

    retried = operations.retry(ManagedJob.objects.all(), reset_counters=True)
    assert sorted(retried.retried) == sorted([queued.pk, failed.pk])  # canceled, failed
    assert retried.held == {}
    job = ManagedJob.objects.get(pk=failed.pk)
    assert (job.state, job.num_failures) == ("queued", 0)

    when = timezone.now() + timedelta(days=2)
    waiting = sorted([queued.pk, failed.pk, later.pk])
    # The manager hides ``hidden``: the operations act on what the queryset holds.
    assert sorted(operations.schedule(ManagedJob.objects.all(), when)) == waiting
    assert ManagedJob._base_manager.get(pk=hidden.pk).process_after is None
    assert sorted(operations.run_now(ManagedJob.objects.all())) == waiting
    assert operations.run_now(ManagedJob.objects.all()) == []  # due already


def test_queryset_methods_delegate_with_their_old_return_values():
    queued, running, done = JobFactory(), JobFactory(state="processing"), JobFactory(state="failed")
    everything = QueueJob.objects.filter(pk__in=[queued.pk, running.pk, done.pk])
    assert everything.cancel() == (1, 1)
    assert everything.cancel() == (0, 0)  # nothing left to cancel
    assert everything.retry() == 2  # failed and canceled
    later = timezone.now() + timedelta(hours=1)
    assert everything.schedule(later) == 2
    assert everything.run_now() == 2


def test_empty_sliced_and_ordered_querysets():
    jobs = JobFactory.create_batch(3)
    assert operations.cancel(QueueJob.objects.none()) == ([], [])
    assert operations.retry(QueueJob.objects.filter(pk__in=[])) == ([], {})
    first_two = QueueJob.objects.order_by("id")[:2]
    assert operations.cancel(first_two).canceled == [j.pk for j in jobs[:2]]
    assert state_of(QueueJob, jobs[2]) == "queued"
    assert operations.cancel(QueueJob.objects.order_by("-priority", "id")).canceled == [jobs[2].pk]


# -- cancel: one guarded statement ---------------------------------------------------


def test_cancel_is_one_statement():
    JobFactory(), JobFactory(state="processing")
    with CaptureQueriesContext(connection) as queries:
        assert QueueJob.objects.all().cancel() == (1, 1)
    # On MariaDB the UPDATE carries its sql_mode (SET STATEMENT … FOR UPDATE …).
    sqls = [q["sql"].removeprefix(mysql_session.SCOPED) for q in queries.captured_queries]
    updates = [sql for sql in sqls if sql.startswith("UPDATE")]
    assert len(updates) == 1, updates


def test_cancel_skips_finished_jobs_and_jobs_already_asked_to_stop():
    jobs = {
        state: JobFactory(state=state)
        for state in ("completed", "failed", "canceled", "processing", "errored")
    }
    asked = JobFactory(state="processing", cancel=True)
    result = operations.cancel(QueueJob.objects.all())
    assert result == ([jobs["errored"].pk], [jobs["processing"].pk])
    errored = QueueJob.objects.get(pk=jobs["errored"].pk)
    assert errored.finished_at is not None
    assert state_of(QueueJob, asked) == "processing"
    assert QueueJob.objects.get(pk=jobs["completed"].pk).finished_at is None


def test_cancel_keeps_the_last_error_of_an_errored_job():
    queued = JobFactory(state="queued", failure_message=None)
    errored = JobFactory(state="errored", failure_message="RuntimeError: boom")
    operations.cancel(QueueJob.objects.all())
    messages = dict(QueueJob.objects.values_list("pk", "failure_message"))
    assert messages[queued.pk] == "canceled before it ran"
    assert messages[errored.pk] == (
        "canceled while waiting for its retry; last error: RuntimeError: boom"
    )


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_cancel_of_a_job_that_errors_while_the_cancel_waits_for_its_row_cancels_it():
    """A worker's outcome write holds the row (processing → errored) when the operator
    cancels. The cancel waits for the row and must judge it by its new state. The old
    two-statement cancel (queued/errored, then processing) canceled it in neither."""
    job = JobFactory(state="processing", worker_hostname="w:1:a")
    locked, release = threading.Event(), threading.Event()
    result = []

    def worker_outcome():
        try:
            with transaction.atomic():
                QueueJob.objects.filter(pk=job.pk).update(
                    state="errored", num_failures=1, failure_message="boom"
                )
                locked.set()
                release.wait(20)
        finally:
            connections.close_all()

    def operator():
        try:
            result.append(QueueJob.objects.filter(pk=job.pk).cancel())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker_outcome), threading.Thread(target=operator)]
    threads[0].start()
    assert locked.wait(20)
    threads[1].start()

    def cancel_waits_for_the_row():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%'"
            )
            return cursor.fetchone()[0] > 0

    wait_until(cancel_waits_for_the_row, 20, message="the cancel to wait for the row lock")
    release.set()
    for thread in threads:
        thread.join(30)
    assert result == [(1, 0)]  # canceled now, not merely asked to stop
    job = QueueJob.objects.get(pk=job.pk)
    assert (job.state, job.cancel, job.failure_message) == (
        "canceled",
        True,
        "canceled while waiting for its retry; last error: boom",
    )


# -- the database's clock ----------------------------------------------------------------


def test_run_now_uses_the_database_clock(monkeypatch):
    """An application server whose clock runs an hour ahead: run-now must still make
    the job claimable by the database's clock (what the workers' claims compare)."""
    soon = JobFactory(process_after=timezone.now() + timedelta(minutes=10))
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=1))
    assert QueueJob.objects.filter(pk=soon.pk).run_now() == 1
    soon.refresh_from_db()
    assert soon.process_after is None  # claimable at once, queued by the database's clock
    assert abs(soon.queued_at - real_now()) < timedelta(minutes=1)


def test_retry_and_cancel_write_the_database_clock(monkeypatch):
    failed, queued = JobFactory(state="failed"), JobFactory()
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() - timedelta(days=1))
    QueueJob.objects.filter(pk=failed.pk).retry()
    QueueJob.objects.filter(pk=queued.pk).cancel()
    monkeypatch.undo()
    after = timezone.now()
    assert after - QueueJob.objects.get(pk=failed.pk).queued_at < timedelta(minutes=1)
    assert after - QueueJob.objects.get(pk=queued.pk).finished_at < timedelta(minutes=1)


# -- wake-ups ------------------------------------------------------------------------------


@needs_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["retry", "run_now"])
def test_retry_and_run_now_wake_idle_workers(run_worker, name):
    """The worker polls every 30 s: a job it completes sooner was woken by NOTIFY."""
    if name == "retry":
        job = JobFactory(state="failed")
    else:
        job = JobFactory(process_after=timezone.now() + timedelta(hours=1))
    tw, _ = idle_worker(run_worker, SlowPollHandler())
    wait_until(lambda: tw.worker.listeners[0].connected.is_set(), 10, message="LISTEN")
    getattr(operations, name)(QueueJob.objects.filter(pk=job.pk))
    wait_until(lambda: state_of(QueueJob, job) == "completed", 10, message="the woken worker")
