"""Async handlers on the worker's event loop (issue 16): coroutines, not a thread per
job, with every guarantee of the threaded path. Both databases; real workers."""

import asyncio
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.test import override_settings

from django_dbworker.runtime.loop import AsyncioExecutor
from django_dbworker.runtime.signals import REPEAT_WINDOW
from tests.chaos.conftest import worker_env
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import Event, QueueJob

pytestmark = pytest.mark.django_db(transaction=True)


def state(job):
    return QueueJob.objects.get(pk=job.pk).state


def kinds(job):
    return list(Event.objects.filter(job_id=job.pk).order_by("pk").values_list("kind", flat=True))


class InFlight(h.BehaviorHandler):
    """Counts the coroutines in flight at once and the threads they run in."""

    num_handlers = 50
    in_flight = 0
    most = 0
    threads: set[int] = set()

    async def handle(self, job):
        cls = type(self)
        cls.threads.add(threading.get_ident())
        cls.in_flight += 1  # one event loop: no lock needed
        cls.most = max(cls.most, cls.in_flight)
        try:
            await asyncio.sleep(0.5)
        finally:
            cls.in_flight -= 1


def test_async_handle_runs_as_coroutines_on_one_event_loop(run_worker):
    jobs = JobFactory.create_batch(50)
    tw = run_worker(InFlight(), burst=True)
    [lane] = tw.worker.lanes
    assert isinstance(lane.executor, AsyncioExecutor)
    assert tw.join() == 0
    assert {state(job) for job in jobs} == {"completed"}
    assert len(InFlight.threads) == 1  # the loop's thread, whatever the number in flight
    assert InFlight.most >= 25  # one claim fills many slots: no thread per job caps them


def test_sync_hooks_retries_and_non_retryable_errors(run_worker):
    flaky = JobFactory(behavior="fail_times", payload={"times": 1})
    bad = JobFactory(behavior="nonretryable")
    logged = JobFactory(behavior="log")
    assert run_worker(h.AsyncBehaviorHandler(), burst=True).join() == 0
    flaky.refresh_from_db()
    assert (flaky.state, flaky.num_failures) == ("completed", 1)
    bad.refresh_from_db()
    assert (bad.state, bad.num_failures) == ("failed", 1)
    assert "NonRetryableError" in bad.failure_message
    logged.refresh_from_db()
    assert [entry["key"] for entry in logged.execution_logs] == ["step-1", "step-2"]
    # post_handle (sync, with the ORM) saw the state each row took.
    assert kinds(flaky)[-1] == "post_handle:completed"
    assert kinds(bad)[-1] == "post_handle:failed"


def test_a_coroutine_past_its_maximum_runtime_is_cancelled(run_worker):
    job = JobFactory(behavior="sleep", payload={"seconds": 60})
    handler = h.AsyncBehaviorHandler(
        maximum_runtime_per_job=timedelta(seconds=0.5), max_num_retries=0
    )
    tw = run_worker(handler)
    wait_until(lambda: "post_handle:failed" in kinds(job), 20, message="the timed-out coroutine")
    job.refresh_from_db()
    assert "exceeded the maximum runtime of 0.5s" in job.failure_message
    assert kinds(job) == ["start", "end", "post_handle:failed"]  # its finally block ran
    assert tw.stop() == 0


@override_settings(DBWORKER={"MIDDLEWARE": ["tests.testapp.middleware.async_outer"]})
def test_async_capable_and_plain_middleware_wrap_an_async_handler(run_worker):
    class Wrapped(h.AsyncBehaviorHandler):
        middleware = ["tests.testapp.middleware.inner", "tests.testapp.middleware.gate"]

    ran, skipped = JobFactory(behavior="ok"), JobFactory(behavior="skip")
    assert run_worker(Wrapped(), burst=True).join() == 0
    assert kinds(ran) == [
        "async_outer:before",
        "inner:before",
        "start",
        "end",
        "inner:after",
        "async_outer:after",
        "post_handle:completed",
    ]
    assert kinds(skipped) == [
        "async_outer:before",
        "inner:before",
        "inner:after",
        "async_outer:after",
        "post_handle:completed",
    ]


def test_two_stage_shutdown_cancels_coroutines_and_requeues_them(spawn):
    jobs = QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": 60}) for _ in range(3)
    )
    worker = spawn(
        "runworker",
        "tests.testapp.handlers.AsyncBehaviorHandler",
        "--no-resetter",
        env=worker_env(),
    )
    wait_until(
        lambda: Event.objects.filter(kind="start").count() == 3,
        30,
        message="three coroutines in their sleep",
    )
    worker.signal(signal.SIGTERM)  # drain: they run on
    wait_until(lambda: "waiting up to" in worker.output, 10, message="the drain")
    assert QueueJob.objects.filter(state="processing").count() == 3
    time.sleep(REPEAT_WINDOW + 0.3)  # sooner, it is taken for a copy of the first
    worker.signal(signal.SIGTERM)  # stop them now: their tasks are cancelled
    assert worker.wait(30) == 0, worker.output
    for job in jobs:
        job.refresh_from_db()
        assert (job.state, job.num_failures, job.num_resets) == ("queued", 0, 0)
        assert kinds(job)[-2:] == ["end", "post_handle:queued"]
