"""``maximum_runtime_per_job`` against handlers that ignore it (issue 42, item 13), in
real ``runworker`` processes: a busy loop in Python that never looks at its
cancellation stayed ``processing``, heartbeated for ever, and ended ``completed``.
Past the limit the attempt errors whatever the handler does; past the limit and its
grace the worker writes that outcome without the handler, the job is retried, and
nothing the thread left running does reaches the row."""

import signal
import time

import pytest

from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.models import Event, QueueJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

HANDLERS = "tests.testapp.handlers"


def events(job, kind):
    return list(Event.objects.filter(job_id=job.pk, kind=kind).order_by("id"))


def test_a_busy_loop_past_its_runtime_is_written_off_and_retried_beside_it(spawn):
    """The first attempt spins 8 s past a limit of 0.5 s (grace 0.5 s): written off at
    about 1 s, its retry runs in the same worker's other thread while it spins on; what
    it logs, checks in and returns once it stops never reaches the retry's row."""
    job = JobFactory(behavior="runaway", payload={"seconds": 8.0, "hold": 10.0})
    worker = spawn("runworker", f"{HANDLERS}.RunawayHandler", "--no-resetter")
    wait_until(lambda: len(events(job, "start")) == 2, 15, message="the retry's start")
    assert events(job, "runaway-returned") == []  # the first thread still spins
    first, second = events(job, "start")
    assert first.worker == second.worker  # the same worker claimed the retry
    job.refresh_from_db()
    assert (job.state, job.num_failures) == ("processing", 1)
    [written_off] = job.history
    assert written_off["outcome"] == "errored"
    assert written_off["message"].startswith("exceeded the maximum runtime of 0.5s")
    assert "its thread was left running" in written_off["message"]
    # The first thread returns (logs, checks in, returns None) while the retry runs.
    wait_until(lambda: events(job, "runaway-returned"), 15, message="the first thread's end")
    time.sleep(1.0)  # a heartbeat, a writer's turn: what it did would be written by now
    job.refresh_from_db()
    assert (job.state, job.worker_hostname) == ("processing", second.worker)
    assert [e["key"] for e in job.execution_logs] == ["second"]
    assert job.progress["text"] == "second"
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "completed", 20)
    job.refresh_from_db()
    assert [e["key"] for e in job.execution_logs] == ["second"]
    assert job.num_failures == 1
    # post_handle of each attempt ran once its thread returned, with the state written.
    posts = Event.objects.filter(job_id=job.pk, kind__startswith="post")
    wait_until(lambda: posts.count() == 2, 15, message="both post_handle calls")
    assert sorted(e.kind for e in posts) == ["post_handle:completed", "post_handle:errored"]
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
    assert "its outcome is written without it (errored)" in worker.output


def test_a_thread_that_never_returns_keeps_its_slot_and_does_not_hold_up_shutdown(spawn):
    """The lane's one thread spins for a minute: the job fails at its limit and grace
    (retries spent), the thread keeps its slot (the next job waits), and SIGTERM stops
    the worker at once, the thread left behind."""
    job = JobFactory(behavior="spin", payload={"seconds": 60})
    worker = spawn("runworker", f"{HANDLERS}.SpinningTimeoutHandler", "--no-resetter")
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "failed", 15)
    job.refresh_from_db()
    assert job.failure_message.startswith("exceeded the maximum runtime of 0.5s")
    assert events(job, "end") == []  # still spinning
    waiting = JobFactory()
    time.sleep(1.5)
    assert QueueJob.objects.get(pk=waiting.pk).state == "queued"  # no free slot
    stopping = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
    assert time.monotonic() - stopping < 10
    assert "1 handler written off past their maximum runtime still run" in worker.output
    assert QueueJob.objects.get(pk=job.pk).state == "failed"
    assert QueueJob.objects.get(pk=waiting.pk).state == "queued"


def test_a_coroutine_that_blocks_its_loop_past_its_runtime_fails_and_stays_failed(spawn):
    """An ``async def handle`` spinning without an await blocks the event loop, so its
    cancellation cannot even be delivered: the heartbeat and writer threads write the
    outcome meanwhile, and its return 8 s later completes nothing."""
    job = JobFactory(payload={"seconds": 8.0})
    worker = spawn("runworker", f"{HANDLERS}.AsyncRunawayHandler", "--no-resetter")
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "failed", 15)
    assert events(job, "runaway-returned") == []  # failed while the loop still spins
    job.refresh_from_db()
    assert "exceeded the maximum runtime of 0.5s" in job.failure_message
    wait_until(lambda: events(job, "runaway-returned"), 15, message="the coroutine's end")
    wait_until(lambda: events(job, "post_handle:failed"), 15, message="its post_handle")
    job.refresh_from_db()
    assert (job.state, job.num_failures) == ("failed", 1)
    assert job.execution_logs == []  # its late entry was dropped
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output


def test_a_handler_returning_after_its_limit_within_the_grace_does_not_complete(run_worker):
    from tests.testapp import handlers as h

    class Patient(h.TimeoutHandler):
        maximum_runtime_grace = 10

    job = JobFactory(behavior="block", payload={"seconds": 1.0})  # time.sleep: no looks
    assert run_worker(Patient(), burst=True).join() == 0
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.failure_message == (
        "exceeded the maximum runtime of 0.5s (maximum_runtime_per_job); "
        "the handler returned after it"
    )
    assert [e.kind for e in Event.objects.filter(job_id=job.pk)] == [
        "start",
        "end",
        "post_handle:failed",
    ]


def test_a_bad_grace_is_refused():
    from django_dbworker.checks import validate_handler
    from tests.testapp import handlers as h

    class Bad(h.TimeoutHandler):
        maximum_runtime_grace = -1

    messages = [e.msg for e in validate_handler(Bad) if e.id == "dbworker.E004"]
    assert any("maximum_runtime_grace" in m for m in messages), messages
    assert [e for e in validate_handler(h.RunawayHandler) if e.id == "dbworker.E004"] == []
