"""django_dbworker.testing: run queued jobs in a test's own transaction, assert what
is queued. Both ways tests are written: Django's ``TestCase`` and pytest's fixture."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone

from django_dbworker.testing import assert_enqueued, enqueued, run_jobs

from .testapp.handlers import BehaviorHandler, FilteredHandler, UUIDHandler
from .testapp.models import Event, QueueJob, UUIDJob


class RunJobsInATestCase(TestCase):
    """Inside ``TestCase``'s transaction: outcomes, logs, retries, rollback between tests."""

    def test_jobs_run_and_their_outcomes_are_written(self):
        ok = QueueJob.objects.create(behavior="ok")
        logged = QueueJob.objects.create(behavior="log")
        failing = QueueJob.objects.create(behavior="nonretryable")

        run = run_jobs(BehaviorHandler)

        assert sorted(run.completed) == sorted([ok.pk, logged.pk])
        assert run.failed == [failing.pk]
        logged.refresh_from_db()
        assert logged.state == "completed"
        assert [e["key"] for e in logged.execution_logs] == ["step-1", "step-2"]
        failing.refresh_from_db()
        assert "bad input" in failing.failure_message
        # the handler's hooks ran, and wrote through the test's connection
        assert Event.objects.filter(kind="post_handle:completed").count() == 2
        assert enqueued(QueueJob) == []

    def test_errors_due_now_are_retried_until_the_budget_is_spent(self):
        job = QueueJob.objects.create(behavior="fail_times", payload={"times": 2})
        run = run_jobs(BehaviorHandler)  # retry_after = 0: both retries are due at once
        assert run.completed == [job.pk]
        assert run.attempts == 3
        job.refresh_from_db()
        assert job.num_failures == 2

    def test_retries_wait_unless_told_to_run_now(self):
        job = QueueJob.objects.create(behavior="fail")
        run = run_jobs(BehaviorHandler, retry_after=timedelta(hours=1))
        assert (run.errored, run.attempts) == ([job.pk], 1)
        run = run_jobs(BehaviorHandler, retry_after=timedelta(hours=1), retries="now")
        assert (run.failed, run.attempts) == ([job.pk], 2)  # max_num_retries = 2

    def test_scheduled_jobs_wait_and_filters_apply(self):
        later = QueueJob.objects.create(process_after=timezone.now() + timedelta(hours=1))
        other = QueueJob.objects.create(behavior="fail")
        wanted = QueueJob.objects.create(behavior="ok")
        run = run_jobs(FilteredHandler)
        assert run.completed == [wanted.pk]
        assert [j.pk for j in enqueued(QueueJob)] == [
            later.pk,
            other.pk,
        ]  # later: scheduled, other: not this handler's

    def test_limit_stops_after_that_many_attempts(self):
        for _ in range(3):
            QueueJob.objects.create()
        assert run_jobs(BehaviorHandler, limit=2).attempts == 2
        assert_enqueued(QueueJob, count=1)

    def test_a_rolled_back_enqueue_leaves_nothing_to_run(self):
        def view():
            with transaction.atomic():
                QueueJob.objects.create()
                raise RuntimeError("the view failed")

        with pytest.raises(RuntimeError):
            view()
        assert run_jobs(BehaviorHandler).attempts == 0

    def test_assert_enqueued_explains_what_it_found(self):
        QueueJob.objects.create(behavior="ok")
        assert_enqueued(QueueJob, count=1, behavior="ok")
        with self.assertRaisesMessage(AssertionError, "expected 2 enqueued job(s)"):
            assert_enqueued(QueueJob, count=2)
        with self.assertRaisesMessage(AssertionError, "matching {'behavior': 'fail'}, found 0"):
            assert_enqueued(BehaviorHandler, behavior="fail")

    def test_enqueued_refuses_what_is_not_a_queue(self):
        with self.assertRaisesMessage(TypeError, "takes a job model, a handler or a task"):
            enqueued(Event)

    def test_retries_must_be_due_or_now(self):
        with self.assertRaisesMessage(ValueError, 'retries is "due" or "now"'):
            run_jobs(BehaviorHandler, retries="later")


@pytest.mark.django_db
def test_the_dbworker_fixture_runs_uuid_keyed_jobs(dbworker):
    jobs = [UUIDJob.objects.create() for _ in range(3)]
    dbworker.assert_enqueued(UUIDHandler, count=3)
    run = dbworker.run(UUIDHandler)
    assert sorted(run.completed) == sorted(job.pk for job in jobs)
    assert dbworker.enqueued(UUIDJob) == []
    assert UUIDJob.objects.filter(state="completed").count() == 3


def test_the_fixture_rolls_back_what_the_jobs_wrote(dbworker):
    QueueJob.objects.create(behavior="ok")
    dbworker.run(BehaviorHandler)
    assert Event.objects.count() == 3  # start, end, post_handle


def test_and_the_next_test_starts_clean(dbworker):
    assert QueueJob.objects.count() == 0
    assert Event.objects.count() == 0
