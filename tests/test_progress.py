"""Progress check-ins (issue 13): written with the next heartbeat, cleared by the next
claim, shown in the admin and dbworker_status. Both databases, integer and UUID keys."""

import datetime
import io
import threading

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_dbworker.models import WorkerProcess
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import Event, QueueJob, UUIDJob

pytestmark = pytest.mark.django_db(transaction=True)


def progress(model, pk):
    return model.objects.filter(pk=pk).values_list("progress", flat=True).first()


def test_a_check_in_is_written_with_the_next_heartbeat_and_shown(run_worker, admin_client):
    job = JobFactory(behavior="checkin", payload={"steps": 3})
    tw = run_worker(h.CheckinHandler(heartbeat_interval=0.1))
    wait_until(lambda: (progress(QueueJob, job.pk) or {}).get("done") == 3, 10)
    last = progress(QueueJob, job.pk)
    assert (last["text"], last["done"], last["total"]) == ("rows=3000", 3, 4)
    listing = admin_client.get("/admin/testapp/queuejob/").content.decode()
    assert '<progress max="1" value="0.7500" title="3 of 4"></progress> 75%' in listing
    assert (
        "rows=3000"
        in admin_client.get(f"/admin/testapp/queuejob/{job.pk}/change/").content.decode()
    )
    [worker] = WorkerProcess.objects.all()
    detail = admin_client.get(f"/admin/django_dbworker/workerprocess/{worker.pk}/change/")
    assert 'title="3 of 4"></progress> 75%' in detail.content.decode()  # jobs in flight
    out = io.StringIO()
    call_command("dbworker_status", stdout=out)
    assert f"testapp.QueueJob:{job.pk}  rows=3000  3/4 (75%)" in out.getvalue()
    Event.objects.create(job_id=job.pk, kind="release")
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "completed", 10)
    assert tw.stop() == 0
    assert progress(QueueJob, job.pk)["done"] == 3  # the last check-in stays
    QueueJob.objects.filter(pk=job.pk).update(state="queued", behavior="ok")  # again
    tw = run_worker(h.BehaviorHandler(), burst=True)
    assert tw.join() == 0
    assert progress(QueueJob, job.pk) is None  # a new attempt starts without


def test_check_ins_of_uuid_keyed_jobs(run_worker):
    class Checking(h.UUIDHandler):
        def handle(self, job):
            self.attempt.checkin("half", done=1, total=2)
            self.attempt.wait(1.0)

    job = UUIDJob.objects.create()
    tw = run_worker(Checking(heartbeat_interval=0.1))
    wait_until(lambda: progress(UUIDJob, job.pk) is not None, 10)
    assert progress(UUIDJob, job.pk)["text"] == "half"
    assert tw.stop() == 0


def test_check_in_values_are_checked_and_the_text_is_escaped(admin_client):
    from django_dbworker.runtime.attempt import MAX_CHECKIN_TEXT

    job = JobFactory(state="processing", progress={"text": "<b>x</b>", "done": 1, "total": 0})
    listing = admin_client.get("/admin/testapp/queuejob/").content.decode()
    assert "&lt;b&gt;x&lt;/b&gt;" in listing
    assert "<progress" not in listing  # no bar without a positive total
    from django_dbworker.testing import run_jobs

    class Bad(h.BehaviorHandler):
        def behave(self, job):
            self.attempt.checkin("x" * 1000)
            assert len(self.attempt.progress["text"]) == MAX_CHECKIN_TEXT
            self.attempt.checkin(done=float("nan"), total=1)

    QueueJob.objects.filter(pk=job.pk).update(state="queued")
    run = run_jobs(Bad, max_num_retries=0)
    assert run.failed == [job.pk]
    assert (
        "checkin(done=...) must be a finite number"
        in QueueJob.objects.get(pk=job.pk).failure_message
    )


class LastStep(h.BehaviorHandler):
    """Checks in, then completes or fails at once: long before the next heartbeat."""

    heartbeat_interval = 30.0
    stalled_max_age = 120.0
    max_num_retries = 0

    def behave(self, job):
        for step in (1, 2, 3):
            self.attempt.checkin(f"step {step} of 3", done=step, total=3)
        if job.behavior == "fail":
            raise RuntimeError("after the last step")


class LastStepUUID(h.UUIDHandler):
    heartbeat_interval = 30.0
    stalled_max_age = 120.0

    def handle(self, job):
        self.attempt.checkin("all done", done=5, total=5)


def test_the_last_check_in_is_written_with_the_outcome(run_worker):
    """A check-in made just before the attempt ended waited for a heartbeat that never
    came: a completed job showed "step 1 of 3", a failed one nothing."""
    done = JobFactory(behavior="ok")
    failed = JobFactory(behavior="fail")
    keyed = UUIDJob.objects.create()
    tw = run_worker([LastStep(), LastStepUUID()], burst=True)
    assert tw.join() == 0
    for pk, state in ((done.pk, "completed"), (failed.pk, "failed")):
        job = QueueJob.objects.get(pk=pk)
        assert job.state == state
        assert (job.progress["text"], job.progress["done"]) == ("step 3 of 3", 3)
    assert UUIDJob.objects.get(pk=keyed.pk).progress["text"] == "all done"


class LastStepOnALockedRow(h.BehaviorHandler):
    """Checks in, then ends while another transaction (a heartbeat's, an operator's)
    holds its row locked, until ``release`` is set."""

    heartbeat_interval = 30.0
    stalled_max_age = 120.0

    def __init__(self):
        super().__init__()
        self.release, self.released = threading.Event(), threading.Event()

    def handle(self, job):
        from django.db import connections, transaction

        locked = threading.Event()

        def hold_the_row():
            try:
                with transaction.atomic():
                    type(job).objects.select_for_update().get(pk=job.pk)
                    locked.set()
                    self.release.wait(10)
            finally:
                connections.close_all()
                self.released.set()

        threading.Thread(target=hold_the_row, daemon=True).start()
        assert locked.wait(10)
        self.attempt.checkin("the last step", done=1, total=1)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no row locks")
def test_the_last_check_in_waits_for_a_locked_row_with_the_outcome(run_worker, monkeypatch):
    """The check-in's write skipped the locked row; the outcome, written once the lock
    was gone, ended the row without it (seen in CI as a heartbeat's lock, on PostgreSQL
    and MariaDB). The outcome now waits with the check-in."""
    from django_dbworker.runtime.completer import Completer

    handler = LastStepOnALockedRow()
    write_progress = Completer.write_progress

    def then_unlock(self, *args):  # the lock goes between the check-in and the outcome
        try:
            return write_progress(self, *args)
        finally:
            handler.release.set()
            assert handler.released.wait(10)

    monkeypatch.setattr(Completer, "write_progress", then_unlock)
    job = JobFactory(behavior="ok")
    tw = run_worker(handler, burst=True)
    assert tw.join() == 0
    job = QueueJob.objects.get(pk=job.pk)
    assert job.state == "completed"
    assert (job.progress or {}).get("text") == "the last step"


def test_the_testing_helpers_keep_the_last_check_in():
    from django_dbworker.testing import run_jobs

    job = JobFactory(behavior="ok")
    assert run_jobs(LastStep).completed == [job.pk]
    assert progress(QueueJob, job.pk)["text"] == "step 3 of 3"


class AsyncSteps(h.BehaviorHandler):
    """Checks in from ``async def handle``, across a heartbeat, then once more at its end."""

    async def handle(self, job):
        import asyncio

        self.attempt.checkin("step 1 of 2", done=1, total=2)
        await asyncio.sleep(1.0)  # several heartbeats
        self.attempt.checkin("step 2 of 2", done=2, total=2)


def test_check_ins_of_an_async_handler_are_written_live_and_with_the_outcome(run_worker):
    """Check-ins x async handlers: a coroutine's check-in goes out with the next
    heartbeat while it awaits, and its last one with the outcome."""
    job = JobFactory()
    from django_dbworker.runtime.loop import AsyncioExecutor

    tw = run_worker(AsyncSteps(), burst=True)
    [lane] = tw.worker.lanes
    assert isinstance(lane.executor, AsyncioExecutor)  # a coroutine, not a thread
    wait_until(
        lambda: (progress(QueueJob, job.pk) or {}).get("text") == "step 1 of 2",
        5,
        message="the check-in written while the coroutine awaits",
    )
    assert QueueJob.objects.get(pk=job.pk).state == "processing"
    assert tw.join() == 0
    done = QueueJob.objects.get(pk=job.pk)
    assert done.state == "completed"
    assert (done.progress["text"], done.progress["done"]) == ("step 2 of 2", 2)


def test_a_retried_or_reset_job_keeps_its_last_check_in_until_its_next_claim(run_worker):
    """Check-ins x retry and reset: an operator's retry and the resetter's requeue
    leave the last check-in shown; the next attempt starts without it."""
    from django_dbworker.maintenance.resetter import Resetter

    failed = JobFactory(behavior="fail")
    assert run_worker(LastStep(), burst=True).join() == 0
    assert QueueJob.objects.get(pk=failed.pk).state == "failed"
    QueueJob.objects.filter(pk=failed.pk).update(behavior="ok")
    assert QueueJob.objects.filter(pk=failed.pk).retry() == 1
    stalled = JobFactory(behavior="ok")
    QueueJob.objects.filter(pk=stalled.pk).update(
        state="processing",
        worker_hostname="gone:1:aaaaaa",
        last_heartbeat_at=timezone.now() - datetime.timedelta(minutes=5),
        progress={"text": "half way", "done": 1, "total": 2},
    )
    resetter = Resetter([h.BehaviorHandler()])
    try:
        resetter.run_once()
    finally:
        resetter.close()
    assert QueueJob.objects.get(pk=stalled.pk).state == "queued"
    assert progress(QueueJob, failed.pk)["text"] == "step 3 of 3"
    assert progress(QueueJob, stalled.pk)["text"] == "half way"
    assert run_worker(h.BehaviorHandler(), burst=True).join() == 0
    for pk in (failed.pk, stalled.pk):
        assert QueueJob.objects.get(pk=pk).state == "completed"
        assert progress(QueueJob, pk) is None  # the new attempt checked in nothing


def test_a_task_checks_in_through_current_attempt(run_worker):
    """Check-ins x tasks: a task function checks in through ``current_attempt()``; its
    last check-in is written with its result."""
    from django_dbworker.tasks.handler import task_handlers
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp import tasks as t

    result = t.checks_in.enqueue(3)
    assert run_worker(task_handlers(), burst=True).join() == 0
    job = TaskJob.objects.get(result_id=result.id)
    assert job.state == "completed"
    assert (job.progress["text"], job.progress["done"], job.progress["total"]) == (
        "step 3 of 3",
        3,
        3,
    )


class CheckInThenWait(h.BehaviorHandler):
    heartbeat_interval = 0.1

    def behave(self, job):
        self.attempt.checkin("half way", done=1, total=2)
        if self.attempt.wait(20):
            self.attempt.raise_if_canceled()


def test_a_canceled_job_keeps_its_last_check_in(run_worker):
    """Check-ins x cancel: both travel with the heartbeat; the check-in is written, the
    cancel seen, and the canceled job shows where it stopped."""
    job = JobFactory()
    tw = run_worker(CheckInThenWait())
    wait_until(lambda: (progress(QueueJob, job.pk) or {}).get("done") == 1, 10)
    assert QueueJob.objects.filter(pk=job.pk).cancel() == (0, 1)
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "canceled", 10)
    assert tw.stop() == 0
    assert progress(QueueJob, job.pk)["text"] == "half way"
