"""Real runworker / runresetter subprocesses: signals, crashes, several processes."""

import itertools
import signal
import time

import pytest
from django.utils import timezone

from django_dbworker.runtime.signals import REPEAT_WINDOW
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.models import Event, QueueJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

HANDLER = "tests.testapp.handlers.BehaviorHandler"


def started(job):
    return Event.objects.filter(job_id=job.pk, kind="start").exists()


def test_sigterm_drains_running_jobs_and_takes_nothing_new(spawn):
    running = JobFactory(behavior="sleep", payload={"seconds": 2})
    worker = spawn("runworker", "tests.testapp.handlers.OneAtATimeHandler", "--no-resetter")
    wait_until(lambda: started(running), message="job start")
    waiting = JobFactory()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
    running.refresh_from_db()
    waiting.refresh_from_db()
    assert running.state == "completed"
    assert waiting.state == "queued"
    assert "SIGTERM received, draining" in worker.output


def test_second_sigterm_stops_jobs_and_requeues_them(spawn):
    job = JobFactory(behavior="sleep", payload={"seconds": 60})
    worker = spawn("runworker", HANDLER, "--no-resetter")
    wait_until(lambda: started(job))
    worker.signal(signal.SIGTERM)
    time.sleep(REPEAT_WINDOW + 0.3)  # sooner, it is taken for a copy of the first
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
    job.refresh_from_db()
    assert (job.state, job.num_failures, job.num_resets) == ("queued", 0, 0)


def test_grace_period_then_a_handler_that_ignores_cancel_is_left_to_the_resetter(spawn):
    job = JobFactory(behavior="block", payload={"seconds": 60})
    worker = spawn("runworker", HANDLER, "--no-resetter", "--shutdown-timeout", "0.5")
    wait_until(lambda: started(job))
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 1, worker.output
    assert "did not stop; leaving them to the resetter" in worker.output
    job.refresh_from_db()
    assert job.state == "processing"
    # Its heartbeat stopped with the process: after stalled_max_age the resetter takes it.
    wait_until(
        lambda: (
            spawn("runresetter", HANDLER, "--once").wait(30) == 0
            and QueueJob.objects.get(pk=job.pk).state == "queued"
        ),
        timeout=20,
        interval=0.5,
    )


def test_kill_9_then_resetter_then_another_worker_completes_the_job(spawn):
    job = JobFactory(behavior="crash_once")
    others = JobFactory.create_batch(5)
    worker = spawn("runworker", "tests.testapp.handlers.OneAtATimeHandler", "--no-resetter")
    assert worker.wait(30) == -signal.SIGKILL
    job.refresh_from_db()
    assert job.state == "processing"
    resetter = spawn("runresetter", HANDLER, "--interval", "0.3")
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "queued", timeout=20)
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(10) == 0
    assert "reset: no heartbeat" in resetter.output
    again = spawn("runworker", HANDLER, "--burst")
    assert again.wait(60) == 0, again.output
    job.refresh_from_db()
    assert (job.state, job.num_resets) == ("completed", 1)
    assert {o.state for o in QueueJob.objects.filter(pk__in=[o.pk for o in others])} == {
        "completed"
    }


def test_poison_job_fails_after_max_num_resets(spawn):
    poison = JobFactory(behavior="crash")
    healthy = JobFactory.create_batch(3)
    deadline = time.monotonic() + 60
    while QueueJob.objects.get(pk=poison.pk).state != "failed":
        assert time.monotonic() < deadline, "poison job never failed"
        spawn("runworker", "tests.testapp.handlers.OneAtATimeHandler", "--no-resetter").wait(30)
        wait_until(
            lambda: (
                spawn("runresetter", HANDLER, "--once").wait(30) == 0
                and QueueJob.objects.get(pk=poison.pk).state != "processing"
            ),
            timeout=20,
            interval=0.3,
        )
    poison.refresh_from_db()
    assert poison.num_resets == 2
    assert poison.failure_message == "job processor died while handling this job too many times"
    assert spawn("runworker", HANDLER, "--burst").wait(60) == 0
    assert {j.state for j in QueueJob.objects.filter(pk__in=[j.pk for j in healthy])} == {
        "completed"
    }


def test_three_processes_share_the_queue_without_overlap(spawn):
    total = 300
    JobFactory.create_batch(total - 60)
    JobFactory.create_batch(60, behavior="fail_times", payload={"times": 1})
    workers = [spawn("runworker", HANDLER, "--burst") for _ in range(3)]
    for worker in workers:
        assert worker.wait(120) == 0, worker.output
    assert set(QueueJob.objects.values_list("state", flat=True)) == {"completed"}
    attempts = {}
    for event in Event.objects.filter(kind__in=["start", "end"]):
        attempts.setdefault((event.job_id, event.token), []).append(event)
    assert len(attempts) == total + 60  # one attempt each, two for the retried ones
    by_job = {}
    for (job_id, _), events in attempts.items():
        assert len(events) == 2
        start, end = sorted(e.at for e in events)
        by_job.setdefault(job_id, []).append((start, end))
    for spans in by_job.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "two attempts of one job overlapped"
    assert len({e.worker for e in Event.objects.filter(kind="start")}) >= 2


def test_heartbeat_keeps_a_long_job_alive_past_stalled_max_age(spawn):
    job = JobFactory(behavior="block", payload={"seconds": 4})  # stalled_max_age is 2s
    worker = spawn("runworker", HANDLER, "--burst")
    resetter = spawn("runresetter", HANDLER, "--interval", "0.2")
    assert worker.wait(60) == 0, worker.output
    resetter.signal(signal.SIGINT)
    assert resetter.wait(10) == 0
    job.refresh_from_db()
    assert (job.state, job.num_resets) == ("completed", 0)
    assert job.finished_at <= timezone.now()
