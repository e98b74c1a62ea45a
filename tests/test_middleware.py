"""Middleware around attempts (issue 13): the onion's order, short circuits, errors,
async handlers, a real worker, and the checks. Both databases."""

import pytest
from django.test import override_settings

from django_dbworker.checks import check_settings_and_handlers, validate_handler
from django_dbworker.testing import run_jobs
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import Event, QueueJob

pytestmark = pytest.mark.django_db(transaction=True)

GLOBAL = {"MIDDLEWARE": ["tests.testapp.middleware.outer"]}


class Wrapped(h.BehaviorHandler):
    middleware = ["tests.testapp.middleware.inner", "tests.testapp.middleware.gate"]


class AsyncWrapped(h.AsyncOrmHandler):
    middleware = ["tests.testapp.middleware.inner"]


def kinds(job):
    return list(Event.objects.filter(job_id=job.pk).order_by("pk").values_list("kind", flat=True))


@override_settings(DBWORKER=GLOBAL)
def test_global_middleware_wraps_the_handlers_which_wraps_the_hooks():
    job = JobFactory()
    assert run_jobs(Wrapped).completed == [job.pk]
    assert kinds(job) == [
        "outer:before",
        "inner:before",
        "start",
        "end",
        "inner:after",
        "outer:after",
        "post_handle:completed",
    ]
    job.refresh_from_db()
    assert Event.objects.get(job_id=job.pk, kind="outer:before").worker == job.worker_hostname


def test_a_middleware_may_short_circuit_the_attempt():
    job = JobFactory(behavior="skip")
    assert run_jobs(Wrapped).completed == [job.pk]
    assert kinds(job) == ["inner:before", "inner:after", "post_handle:completed"]


def test_what_a_middleware_raises_is_the_attempts_error():
    job = JobFactory(behavior="refuse")
    assert run_jobs(Wrapped, max_num_retries=0).failed == [job.pk]
    job.refresh_from_db()
    assert "PermissionError: tenant over quota" in job.failure_message
    assert kinds(job) == ["inner:before", "inner:raised:PermissionError", "post_handle:failed"]


@override_settings(DBWORKER=GLOBAL)
def test_middleware_wraps_async_handlers_on_a_real_worker(run_worker):
    jobs = JobFactory.create_batch(3)
    assert run_worker(AsyncWrapped(num_handlers=2), burst=True).join() == 0
    for job in jobs:
        assert QueueJob.objects.get(pk=job.pk).state == "completed"
        assert kinds(job)[:3] == ["outer:before", "inner:before", "start"]
        assert kinds(job)[-4:] == ["end", "inner:after", "outer:after", "post_handle:completed"]


def test_middleware_that_cannot_be_used_is_a_check_error():
    class Broken(h.BehaviorHandler):
        middleware = ["tests.testapp.middleware.nowhere", 42]  # type: ignore[list-item]

    messages = [m.msg for m in validate_handler(Broken) if m.id == "dbworker.E011"]
    assert len(messages) == 2
    assert "'tests.testapp.middleware.nowhere' cannot be used" in messages[0]
    assert "42 cannot be used: middleware 42 is not callable" in messages[1]
    with override_settings(DBWORKER={"MIDDLEWARE": "tests.testapp.middleware.outer"}):
        [error] = [m for m in check_settings_and_handlers() if m.id == "dbworker.E011"]
    assert "must be a list" in error.msg


@override_settings(DBWORKER=GLOBAL)
def test_global_middleware_wraps_the_attempts_of_tasks_on_a_real_worker(run_worker):
    """Middleware x tasks: ``DBWORKER["MIDDLEWARE"]`` wraps the task backend's
    attempts as any handler's."""
    from django_dbworker.tasks.handler import task_handlers
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp import tasks as t

    result = t.add.enqueue(2, 3)
    assert run_worker(task_handlers(), burst=True).join() == 0
    job = TaskJob.objects.get(result_id=result.id)
    assert (job.state, job.return_value) == ("completed", 5)
    assert kinds(job) == ["outer:before", "outer:after"]


def test_a_running_jobs_cancellation_goes_out_through_the_middleware(run_worker):
    """Middleware x cancel: the cancellation a cooperative handler raises passes
    through its middleware, and the job ends canceled, not errored."""
    job = JobFactory(behavior="sleep", payload={"seconds": 20})
    tw = run_worker(Wrapped())
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "processing", 10)
    assert QueueJob.objects.filter(pk=job.pk).cancel() == (0, 1)
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "canceled", 10)
    assert tw.stop() == 0
    job.refresh_from_db()
    assert job.num_failures == 0
    raised = [k for k in kinds(job) if k.startswith("inner:raised:")]
    assert len(raised) == 1, kinds(job)
    assert kinds(job)[-1] == "post_handle:canceled"
