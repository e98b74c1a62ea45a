"""Snooze (issue 44, item 4): ``raise Snooze(seconds)`` puts the job back in the queue
for a time without counting a failure or using a retry; ``num_snoozes`` counts it,
``max_snoozes`` caps it, and a later error's backoff counts failures only."""

import itertools
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbworker import Handler, Snooze
from django_dbworker.runtime.execution import decide
from django_dbworker.runtime.outcome import OutcomeKind
from django_dbworker.tasks.models import TaskJob
from django_dbworker.testing import run_jobs, run_tasks
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.test_metrics import free_port, scrape, serving, value
from tests.testapp import snooze_handlers as h
from tests.testapp import snooze_tasks
from tests.testapp.models import Event, QueueJob

pytestmark = pytest.mark.django_db


def starts(job):
    return Event.objects.filter(job_id=job.pk, kind="start").count()


def test_a_hundred_snoozes_leave_the_whole_retry_budget():
    """100 snoozes, then 3 errors with max_num_retries = 3: the fourth run completes."""
    job = JobFactory(payload={"snoozes": 100, "errors": 3})
    run = run_jobs(h.SnoozingHandler)
    job.refresh_from_db()
    assert (job.state, job.num_snoozes, job.num_failures) == ("completed", 100, 3)
    assert run.attempts == starts(job) == 104
    outcomes = [entry["outcome"] for entry in job.history]
    assert outcomes[-3:] == ["errored"] * 3
    assert set(outcomes[:-3]) == {"snoozed"}


def test_without_snoozes_the_same_errors_spend_the_budget():
    """The control: 4 errors fail the job (so the test above can fail)."""
    job = JobFactory(payload={"snoozes": 100, "errors": 4})
    run_jobs(h.SnoozingHandler)
    job.refresh_from_db()
    assert (job.state, job.num_snoozes, job.num_failures) == ("failed", 100, 4)


def test_a_snooze_waits_its_time_off_the_claim_path():
    job = JobFactory(payload={"snoozes": 1, "seconds": 30})
    before = timezone.now()
    run = run_jobs(h.SnoozingHandler)
    job.refresh_from_db()
    assert run.snoozed == [job.pk]
    assert (job.state, job.num_snoozes, job.num_failures) == ("queued", 1, 0)
    assert (job.started_at, job.finished_at) == (None, None)
    assert (
        before + timedelta(seconds=29) < job.process_after < timezone.now() + timedelta(seconds=31)
    )
    [entry] = job.history
    assert entry["outcome"] == "snoozed"
    assert entry["message"] == "snoozed for 30.0 s, 1 of at most 200"
    assert entry["started_at"] is not None
    # Nothing claims it before its time; run_now() makes it claimable at once.
    assert run_jobs(h.SnoozingHandler).attempts == 0
    QueueJob.objects.filter(pk=job.pk).run_now()
    run_jobs(h.SnoozingHandler)
    job.refresh_from_db()
    assert (job.state, job.num_snoozes) == ("completed", 1)


def test_backoff_after_snoozes_counts_failures_only():
    """retry_after 100 s, backoff x10: after 5 snoozes, the first error waits 100 s
    (5 snoozes counted as failures would make it 10,000,000 s)."""
    job = JobFactory(payload={"snoozes": 5, "errors": 1})
    run_jobs(h.BackoffHandler)
    job.refresh_from_db()
    assert (job.state, job.num_snoozes, job.num_failures) == ("errored", 5, 1)
    wait = (job.process_after - job.finished_at).total_seconds()
    assert 99 <= wait <= 101


def test_a_snooze_loop_is_bounded_by_max_snoozes():
    job = JobFactory()
    run = run_jobs(h.CappedSnoozeHandler)
    job.refresh_from_db()
    assert run.failed == [job.pk]
    assert starts(job) == 6  # 5 snoozes, then the one that fails it
    assert (job.state, job.num_snoozes) == ("failed", 5)
    assert "snoozed 5 time(s) already, the most max_snoozes allows (5)" in job.failure_message
    # Failed for good: no retry used on it, although the handler has retries.
    assert job.num_failures == 1
    assert run_jobs(h.CappedSnoozeHandler).attempts == 0


def test_no_cap_with_max_snoozes_none():
    job = JobFactory()
    run = run_jobs(h.CappedSnoozeHandler, max_snoozes=None, limit=20)
    job.refresh_from_db()
    assert (run.attempts, job.state, job.num_snoozes) == (20, "queued", 20)
    assert job.history[-1]["message"] == "snoozed for 0 ms, 20"


def test_an_async_handler_snoozes():
    job = JobFactory(payload={"snoozes": 2})
    run_jobs(h.AsyncSnoozingHandler)
    job.refresh_from_db()
    assert (job.state, job.num_snoozes, job.num_failures) == ("completed", 2, 0)


def test_a_cancel_requested_while_it_ran_wins_over_the_snooze():
    class CancelThenSnooze(h.SnoozingHandler):
        def handle(self, job):
            QueueJob.objects.filter(pk=job.pk).update(cancel=True)
            raise Snooze(60)

    job = JobFactory()
    run = run_jobs(CancelThenSnooze)
    job.refresh_from_db()
    assert run.canceled == [job.pk]
    assert (job.state, job.num_snoozes, job.process_after) == ("canceled", 0, None)
    assert job.history[-1]["outcome"] == "canceled"


def test_retry_with_reset_counters_zeroes_snoozes():
    job = JobFactory()
    run_jobs(h.CappedSnoozeHandler)
    QueueJob.objects.filter(pk=job.pk).retry(reset_counters=True)
    job.refresh_from_db()
    assert (job.state, job.num_snoozes, job.num_failures) == ("queued", 0, 0)


def test_a_task_snoozes():
    result = snooze_tasks.snooze_once.enqueue("a")
    run_tasks()
    row = TaskJob.objects.get(result_id=result.id)
    assert (row.state, row.num_snoozes, row.num_failures) == ("completed", 1, 0)
    assert row.return_value == 1
    result.refresh()
    assert result.attempts == 2


@pytest.mark.parametrize(
    "bad", [-1, float("inf"), float("nan"), "3", True], ids=["neg", "inf", "nan", "str", "bool"]
)
def test_snooze_refuses_bad_durations(bad):
    with pytest.raises((TypeError, ValueError)):
        Snooze(bad)


def test_snooze_takes_a_timedelta():
    assert Snooze(timedelta(minutes=2)).seconds == 120.0


def test_decide_makes_a_snooze_only_when_nothing_else_was_asked():
    from django_dbworker.exceptions import CancelReason

    handler = h.SnoozingHandler()
    job = QueueJob(num_snoozes=3)
    outcome = decide(handler, None, Snooze(30), 0, 60.0, job)
    assert (outcome.kind, outcome.retry_delay) == (OutcomeKind.SNOOZED, 30.0)
    assert outcome.message == "snoozed for 30.0 s, 4 of at most 200"
    canceled = decide(handler, CancelReason.CANCELED, Snooze(30), 0, 60.0, job)
    assert canceled.kind is OutcomeKind.CANCELED
    timed_out = decide(handler, CancelReason.TIMEOUT, Snooze(30), 0, 60.0, job)
    assert timed_out.kind is OutcomeKind.ERRORED


def test_max_snoozes_is_checked():
    from django_dbworker.checks import validate_handler

    class Bad(Handler):
        model = QueueJob
        max_snoozes = -1

        def handle(self, job):
            pass

    assert [e.id for e in validate_handler(Bad)] == ["dbworker.E004"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_a_real_worker_snoozes_and_wakes_for_it(spawn):
    """runworker: two snoozes of 1 s each, then the job completes; each run waits its
    snooze (the stager wakes the dispatcher when it comes due)."""
    job = JobFactory(payload={"snoozes": 2, "seconds": 1})
    port = free_port()
    handler = "tests.testapp.snooze_handlers.SleepySnoozeHandler"
    worker = spawn(
        "runworker", handler, "--metrics-port", str(port), "--metrics-address", "127.0.0.1"
    )
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "completed", 30)
    # The metric counts each snooze apart from requeues.
    wait_until(
        lambda: (
            (f := serving(port))
            and value(f, "dbworker_jobs_finished_total", handler=handler, outcome="completed") == 1
        ),
        20,
        message="the scrape",
    )
    figures = scrape(port)
    assert value(figures, "dbworker_jobs_finished_total", handler=handler, outcome="snoozed") == 2
    assert value(figures, "dbworker_jobs_finished_total", handler=handler, outcome="requeued") == 0
    job.refresh_from_db()
    assert (job.num_snoozes, job.num_failures) == (2, 0)
    times = [e.at for e in Event.objects.filter(job_id=job.pk, kind="start").order_by("id")]
    assert len(times) == 3
    # Each run after a snooze waited for it (not claimed again at once).
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times))
    assert [e["outcome"] for e in job.history] == ["snoozed", "snoozed"]
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
    assert "snoozed for 1.0 s, 1 of at most 200" in worker.output


def test_the_admin_job_page_shows_the_snoozes(admin_client):
    from django.urls import reverse

    from django_dbworker.admin.explain import explain
    from tests.test_admin_dashboard import serving

    job = JobFactory(payload={"snoozes": 1, "seconds": 600})
    run_jobs(h.SnoozingHandler)
    job.refresh_from_db()
    [reason] = [r for r in explain(job, serving(QueueJob)) if r.code == "snoozed"]
    assert "it snoozed 1 time(s)" in reason.text
    page = admin_client.get(reverse("admin:testapp_queuejob_change", args=[job.pk]))
    html = page.content.decode()
    assert "Num snoozes" in html
    assert "snoozed for 10.0 min, 1 of at most 200" in html
