"""Tasks of ``django.tasks`` the tests enqueue (module level, as the framework requires).

Django's ``@task`` where no engine option is set; ``django_dbworker.tasks.task``
(``@dbworker_task``) where one is, which takes them on every Django version (6.0's
``@task`` takes none).
"""

import asyncio
import threading
import time

from django_dbworker.tasks import task as dbworker_task
from django_dbworker.tasks.compat import require

from .models import Event, LedgerEntry

tasks = require()
task = tasks.task


@task
def add(a, b):
    return a + b


@task(priority=10, queue_name="emails")
def send_welcome(user_id):
    Event.objects.create(job_id=user_id, kind="welcome")
    return f"welcomed {user_id}"


@dbworker_task(max_retries=2, retry_after=0)
def flaky(key, fail_times):
    done = Event.objects.filter(kind=f"flaky:{key}").count()
    Event.objects.create(job_id=0, kind=f"flaky:{key}")
    if done < fail_times:
        raise ValueError(f"attempt {done + 1} fails")
    return done + 1


@task
def always_fails():
    raise KeyError("always")


@task
def returns_a_set():
    return {1, 2}


@task(takes_context=True)
def with_context(context, value):
    return {"attempt": context.attempt, "id": context.task_result.id, "value": value}


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    count = await Event.objects.acount()
    return {"sum": a + b, "events": count}


class InFlight:
    """``in_flight`` tasks running now, the most at once, and the threads they ran in."""

    now = 0
    most = 0
    threads: set[str] = set()


@task
async def in_flight(seconds):
    InFlight.threads.add(threading.current_thread().name)
    InFlight.now += 1  # one event loop: no lock needed
    InFlight.most = max(InFlight.most, InFlight.now)
    try:
        await asyncio.sleep(seconds)
    finally:
        InFlight.now -= 1
    return threading.current_thread().name


@task
def sleeper(seconds):
    time.sleep(seconds)
    return seconds


@dbworker_task(max_retries=5)
def refuses():
    from django_dbworker import NonRetryableError

    raise NonRetryableError("bad input")


@task(takes_context=True)
def own_status(context):
    """What the backend says of this very task while it runs."""
    result = context.task_result.task.get_result(context.task_result.id)
    return {"status": str(result.status), "workers": len(result.worker_ids)}


@dbworker_task(max_runtime=0.5)
def overruns(seconds):
    import time

    from django_dbworker.handler import current_attempt

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        attempt = current_attempt()
        if attempt is not None and attempt.wait(0.05):
            attempt.raise_if_canceled()
    return "finished"


@task
def cooperative_sleep(seconds):
    from django_dbworker.handler import current_attempt

    attempt = current_attempt()
    if attempt is not None and attempt.wait(seconds):
        attempt.raise_if_canceled()
    return seconds


@task(queue_name="emails")
def noop_email():
    return None


@task
def noop():
    return None


@task
def record_order(tag):
    Event.objects.create(job_id=0, kind=f"order:{tag}")


@task(takes_context=True)
def chaos_nap(context, seconds):
    """The chaos suite's task: records its attempt (start and end, with its worker)
    around ORM work and a nap, like a handler of the chaos suite."""
    import uuid

    from django_dbworker.handler import current_attempt

    from .handlers import record

    result = context.task_result
    job_id, worker, token = current_attempt().job.pk, result.worker_ids[-1], uuid.uuid4().hex
    record(job_id, "task-start", worker=worker, token=token)
    seen = Event.objects.filter(job_id=job_id, kind="task-start").count()
    time.sleep(seconds)
    record(job_id, "task-end", worker=worker, token=token)
    return {"attempts_seen": seen}


@dbworker_task(unique=True)
def unique_sum(a, b):
    """One queued or running run per arguments."""
    return a + b


@dbworker_task(unique=lambda report_id, **options: f"report:{report_id}")
def build_report(report_id, version=1):
    """One queued or running run per report, whatever the other arguments."""
    return version


@dbworker_task(unique=lambda query, user: f"search:{query}:{user}")
def search(query, user):
    """One queued or running run per query and user: keys longer than the column."""
    return {"user": user}


@task(takes_context=True)
async def async_chaos_nap(context, seconds):
    """``chaos_nap`` as an ``async def`` task: the worker runs it on its event loop."""
    import uuid

    from asgiref.sync import sync_to_async

    from django_dbworker.handler import current_attempt

    from .handlers import record

    result = context.task_result
    job_id, worker, token = current_attempt().job.pk, result.worker_ids[-1], uuid.uuid4().hex
    await sync_to_async(record)(job_id, "task-start", worker=worker, token=token)
    seen = await Event.objects.filter(job_id=job_id, kind="task-start").acount()
    await asyncio.sleep(seconds)
    await sync_to_async(record)(job_id, "task-end", worker=worker, token=token)
    return {"attempts_seen": seen}


@dbworker_task(takes_context=True, max_retries=3, retry_after=0)
def timed(context, fail_times, nap=0.0):
    """Records the attempt times its result shows, then fails its first ``fail_times``
    attempts; naps ``nap`` seconds first on the last attempt (a worker to kill)."""
    result = context.task_result
    Event.objects.create(
        job_id=context.attempt,
        kind="times",
        detail=f"{result.started_at.isoformat()} {result.last_attempted_at.isoformat()}",
    )
    time.sleep(0.01)  # the next attempt starts later, whatever the clock's resolution
    if context.attempt <= fail_times:
        raise ValueError(f"attempt {context.attempt} fails")
    time.sleep(nap)
    return context.attempt


@task
def fails_always_plain():
    """A task without engine options of its own (``using()`` gives it some)."""
    raise ValueError("plain")


@task
def checks_in(steps):
    """Checks in ``steps`` times through ``current_attempt()`` (tests/test_progress.py)."""
    from django_dbworker import current_attempt

    for step in range(1, steps + 1):
        current_attempt().checkin(f"step {step} of {steps}", done=step, total=steps)


@dbworker_task(atomic=True, max_retries=0)
def ledger_entry(key, fail=False):
    """An atomic task (issue 44): its row commits with the run's completion."""
    LedgerEntry.objects.create(job_id=key, phase="task")
    if fail:
        raise RuntimeError("the task failed after its write")
    return key


@dbworker_task(max_retries=0)
def plain_ledger_entry(key, fail=False):
    LedgerEntry.objects.create(job_id=key, phase="task")
    if fail:
        raise RuntimeError("the task failed after its write")
    return key
