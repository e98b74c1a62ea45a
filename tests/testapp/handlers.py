"""Handlers the tests run, in threads and in runworker subprocesses.

``BehaviorHandler`` does what each job's ``behavior`` says and records what happened
in ``Event`` rows, so tests assert on the database, not on mocks.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.db.models import Q

from django_dbworker import Handler, NonRetryableError, Periodic, RateLimit

from .models import (
    Event,
    InitJob,
    PartJob,
    QueueJob,
    ReportJob,
    Repository,
    RepositoryIndexingJob,
    TenantJob,
    UUIDJob,
    WaitingKeyJob,
)

#: Where Events are written: the ``events`` database when the settings have one (a
#: chaos test's direct connection past a pooler, ``DBWORKER_TEST_EVENTS_URL``).
EVENTS = "events" if "events" in settings.DATABASES else "default"


def record(job_id, kind, **fields):
    """Write an Event; ride out a database blip (chaos tests terminate connections).

    ``at`` is taken before the first try, so it is when the thing happened. A retry
    after a lost reply may write the event twice: readers keep the first.
    """
    at = time.time()
    deadline = time.monotonic() + 60
    while True:
        try:
            Event.objects.using(EVENTS).create(job_id=job_id, kind=kind, at=at, **fields)
            return
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            connections[EVENTS].close()
            time.sleep(0.2)


class BehaviorHandler(Handler):
    model = QueueJob
    num_handlers = 4
    interval = 0.05
    heartbeat_interval = 0.2
    stalled_max_age = timedelta(seconds=2)
    max_num_retries = 2
    retry_after = 0
    max_num_resets = 2

    def pre_handle(self, job):
        if job.behavior == "pre_handle_raises":
            raise ValueError("pre_handle broke")

    def post_handle(self, job, outcome):
        # self.attempt is the job's own, even in whichever thread runs post_handle.
        mine = "" if self.attempt.pk == job.pk else ":not-its-attempt"
        record(job.pk, f"post_handle:{outcome.state}{mine}")
        if job.behavior == "post_handle_raises":
            raise ValueError("post_handle broke")
        if job.behavior == "post_handle_exits":
            raise SystemExit(3)

    def handle(self, job):
        attempt = self.attempt
        token = uuid.uuid4().hex
        record(job.pk, "start", worker=attempt.worker_id, token=token)
        try:
            return self.behave(job)
        finally:
            record(job.pk, "end", worker=attempt.worker_id, token=token)

    def behave(self, job):
        behavior, payload = job.behavior, job.payload
        attempt = self.attempt
        if behavior == "ok":
            return None
        if behavior == "fail":
            raise RuntimeError("boom")
        if behavior == "fail_times":
            if job.num_failures < payload.get("times", 1):
                raise RuntimeError(f"failure {job.num_failures + 1}")
            return None
        if behavior == "raise":  # a message of the job's own (terminal escapes, say)
            raise RuntimeError(payload.get("message", "boom"))
        if behavior == "nonretryable":
            raise NonRetryableError("bad input, do not retry")
        if behavior == "sleep":  # cooperative
            if attempt.wait(payload.get("seconds", 1.0)):
                attempt.raise_if_canceled()
            return None
        if behavior == "block":  # ignores cancellation
            if not payload.get("first_only") or job.num_resets == 0:
                time.sleep(payload.get("seconds", 1.0))
            return None
        if behavior == "spin":  # pure Python loop: only interrupt_on_cancel stops it
            deadline = time.monotonic() + payload.get("seconds", 5.0)
            while time.monotonic() < deadline:
                sum(range(100))
            return None
        if behavior == "log":
            entry = attempt.log("step-1", ["echo", "hello"])
            entry.update(out="hello\n")
            entry.finish(exit_code=0)
            with attempt.log("step-2", ["false"]) as second:
                second.update(out=payload.get("out", "<script>alert(1)</script>"), exit_code=1)
            return None
        if behavior == "runaway":  # maximum runtime: ignores cancellation, a busy loop
            if job.num_failures == 0 or payload.get("always"):
                deadline = time.monotonic() + payload.get("seconds", 4.0)
                while time.monotonic() < deadline:  # never looks at attempt.canceled
                    sum(range(100))
                # What it does once it returns must not reach the row (a retry may run).
                attempt.log("late", ["runaway"], out="written after its time")
                attempt.checkin("late")
                record(job.pk, "runaway-returned", worker=attempt.worker_id)
                return None
            attempt.log("second", ["runaway"])
            attempt.checkin("second")
            attempt.wait(payload.get("hold", 6.0))
            return None
        if behavior == "big_log":  # many large entries (the log's bounds)
            for i in range(payload.get("entries", 300)):
                with attempt.log(f"step-{i}", ["make", f"part-{i}"]) as entry:
                    entry.update(out=f"{i:08d}" + "x" * (payload.get("size", 100_000) - 8))
                if payload.get("pause"):  # as a command would take: a write per entry
                    attempt.wait(payload["pause"])
            return None
        if behavior == "binary_output":
            with attempt.log("binary", ["cat", "blob"]) as entry:
                entry.update(out=b"ok \xff\xfe\x00 end")
            return None
        if behavior == "huge_error":
            raise RuntimeError("x" * payload.get("size", 1_000_000))
        if behavior == "return_value":
            return {"unexpected": True}
        if behavior == "return_exception":
            return ValueError("returned, not raised")
        if behavior == "parse":
            json.loads(payload["raw"])
            return None
        if behavior == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if behavior == "crash_once":
            if job.num_resets == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            return None
        if behavior == "kill_heartbeat":  # on the first attempt; then blocks
            if job.num_resets == 0:
                _kill_thread("dbworker-heartbeat")
                time.sleep(payload.get("seconds", 3.0))
            return None
        if behavior == "kill_writer":
            if job.num_resets == 0:
                _kill_thread("dbworker-writer")
            return None
        if behavior == "fence":
            # The first attempt blocks (the test pauses or outlives it), then ends as
            # payload["first"] says; any later attempt ends the other way at once.
            first = job.num_resets == 0
            if first:
                time.sleep(payload.get("seconds", 3.0))
            ending = payload.get("first", "complete")
            if not first:
                ending = "fail" if ending == "complete" else "complete"
            if payload.get("log", True):
                with attempt.log("first" if first else "later", ["fence"]) as entry:
                    entry.update(out=f"attempt {attempt.worker_id}")
            if ending == "fail":
                raise NonRetryableError("fence: failing attempt")
            return None
        if behavior == "bad_str":
            raise UnprintableError()
        if behavior == "cancel_then_fail":  # an operator cancels it; then it fails
            QueueJob.objects.filter(pk=job.pk).update(cancel=True)
            raise RuntimeError("fails after its cancel")
        if behavior == "init":
            if not (getattr(job, "built_by_init", False) and getattr(job, "loaded_from", "")):
                raise AssertionError("built without the model's __init__/from_db")
            return None
        if behavior == "pre_handle_raises" or behavior in (
            "post_handle_raises",
            "post_handle_exits",
        ):
            return None
        raise ValueError(f"unknown behavior {behavior!r}")


class UnprintableError(Exception):
    """An exception whose ``str()`` itself raises (seen in the wild with broken libraries)."""

    def __str__(self):
        raise RuntimeError("__str__ broke")


def _kill_thread(name):
    import ctypes

    for thread in threading.enumerate():
        if thread.name == name:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit)
            )


class ChaosHandler(BehaviorHandler):
    """For the chaos suite: many slots, a heartbeat margin a loaded machine keeps, and
    budgets the injected faults cannot spend (every job must end ``completed``)."""

    num_handlers = 8
    interval = 0.1
    heartbeat_interval = 0.25
    stalled_max_age = timedelta(seconds=3)
    max_num_retries = 1000
    max_num_resets = 1000


class PoisonHandler(ChaosHandler):
    """The reset budget is what stops a poison job."""

    max_num_resets = 3


class LoadHandler(ChaosHandler):
    """Little work per job, so the worker's own machinery is what a load test measures:
    one ORM read each, and an execution-log entry every tenth job."""

    def handle(self, job):
        Event.objects.filter(job_id=job.pk).exists()
        if job.pk % 10 == 0:
            with self.attempt.log("step", ["true"]) as entry:
                entry.update(out="ok")

    def post_handle(self, job, outcome):
        pass


class BrokenQuerysetHandler(BehaviorHandler):
    def get_queryset(self):
        raise RuntimeError("get_queryset broke")


class BadStaticFilterHandler(BehaviorHandler):
    dequeue_filter = Q(no_such_field=1)


class BadDynamicFilterHandler(BehaviorHandler):
    def pre_dequeue(self):
        return Q(no_such_field=1)


class OneAtATimeHandler(BehaviorHandler):
    num_handlers = 1


class WaitingKeyHandler(BehaviorHandler):
    """``WaitingKeyJob``s (waiting-only unique keys), one at a time. ``raise_when_changed``:
    the job waits until a change of it is enqueued (another job waiting with its
    ``name`` or ``target``), then raises: it is retried after a minute."""

    model = WaitingKeyJob
    num_handlers = 1
    retry_after = 60

    def behave(self, job):
        if job.behavior != "raise_when_changed":
            return super().behave(job)
        same = Q(name=job.name) if job.name is not None else Q(target=job.target)
        deadline = time.monotonic() + 30
        while not WaitingKeyJob.objects.filter(same, state="queued").exclude(pk=job.pk).exists():
            if self.attempt.wait(0.05) or time.monotonic() > deadline:
                self.attempt.raise_if_canceled()
                raise TimeoutError("no change of the job came")
        raise RuntimeError("stale input")


class SlowHeartbeatHandler(BehaviorHandler):
    heartbeat_interval = 0.5
    stalled_max_age = timedelta(seconds=30)


class TimeoutHandler(BehaviorHandler):
    maximum_runtime_per_job = timedelta(seconds=0.5)
    max_num_retries = 0


class RunawayHandler(BehaviorHandler):
    """A maximum runtime for the first attempt only; two threads, so the retry of a job
    written off past its maximum runtime runs beside the thread left running."""

    num_handlers = 2
    max_num_retries = 1
    retry_after = 0
    maximum_runtime_grace = 0.5

    def maximum_runtime(self, job):
        return 0.5 if job.num_failures == 0 else None


class SpinningTimeoutHandler(TimeoutHandler):
    """One thread, whose job runs past its maximum runtime and never looks."""

    num_handlers = 1
    maximum_runtime_grace = 0.5


class InterruptingHandler(BehaviorHandler):
    interrupt_on_cancel = True


class PriorityHandler(BehaviorHandler):
    ordering = ("-priority", "id")
    num_handlers = 1


class FilteredHandler(BehaviorHandler):
    dequeue_filter = Q(behavior="ok")


class RelatedFilterHandler(BehaviorHandler):
    dequeue_filter = Q(repository__name="wanted")


class EagerHandler(BehaviorHandler):
    def get_queryset(self):
        return super().get_queryset().select_related("repository")


class BudgetHandler(BehaviorHandler):
    """A worker budget: never more than ``capacity`` units of ``size`` at once."""

    capacity = 3

    def __init__(self, **options):
        super().__init__(**options)
        self.lock = threading.Lock()
        self.used = 0
        self.peak = 0

    def pre_dequeue(self):
        with self.lock:
            remaining = self.capacity - self.used
        return Q(size__lte=remaining) if remaining > 0 else False

    def pre_handle(self, job):
        with self.lock:
            self.used += job.size
            self.peak = max(self.peak, self.used)

    def post_handle(self, job, outcome):
        with self.lock:
            self.used -= job.size


class NotNowHandler(BehaviorHandler):
    def pre_dequeue(self):
        return False


class BadPreDequeueHandler(BehaviorHandler):
    def pre_dequeue(self):
        return 42


class RaisingPreDequeueHandler(BehaviorHandler):
    def pre_dequeue(self):
        raise RuntimeError("pre_dequeue broke")


class NoModelHandler(Handler):
    def handle(self, job):
        return None


class NotAJobModelHandler(Handler):
    model = Event

    def handle(self, job):
        return None


class BadOptionsHandler(BehaviorHandler):
    num_handlers = 0


async def arecord(job_id, kind, **fields):
    await sync_to_async(record)(job_id, kind, **fields)


class AsyncBehaviorHandler(BehaviorHandler):
    """``BehaviorHandler`` with ``async def handle``: a coroutine on the worker's event
    loop. "sleep" awaits (a cancel request cancels it); the other behaviors run the
    sync ``behave`` through ``sync_to_async``, as async code calls blocking code."""

    async def handle(self, job):
        attempt = self.attempt
        token = uuid.uuid4().hex
        start = asyncio.ensure_future(
            arecord(job.pk, "start", worker=attempt.worker_id, token=token)
        )
        try:
            await asyncio.shield(start)
            if job.behavior == "sleep":
                await asyncio.sleep(job.payload.get("seconds", 1.0))
                return None
            return await sync_to_async(self.behave)(job)
        finally:
            # A cancel request cancels the coroutine, even while it awaits the start's
            # write: that write goes on, and the end is written after it in every case.
            await start
            await arecord(job.pk, "end", worker=attempt.worker_id, token=token)


class AsyncRunawayHandler(BehaviorHandler):
    """``async def handle`` that ignores its cancellation in a busy loop of its own: the
    event loop itself is blocked until it returns."""

    maximum_runtime_per_job = 0.5
    maximum_runtime_grace = 0.5
    max_num_retries = 0

    async def handle(self, job):
        attempt = self.attempt
        await arecord(job.pk, "start", worker=attempt.worker_id)
        deadline = time.monotonic() + job.payload.get("seconds", 4.0)
        while time.monotonic() < deadline:  # no await: not even cancellation gets in
            sum(range(100))
        attempt.log("late", ["runaway"])
        # Its cancellation lands at the first await: the record is written all the same.
        returned = asyncio.ensure_future(
            arecord(job.pk, "runaway-returned", worker=attempt.worker_id)
        )
        try:
            await asyncio.shield(returned)
        finally:
            await returned
        return None


class AsyncChaosHandler(AsyncBehaviorHandler, ChaosHandler):
    """The chaos suite's handler as a coroutine."""


class BadOrderingHandler(BehaviorHandler):
    ordering = ("no_such_field",)


# -- Handlers written the way Django code is written (tests/test_ordinary_handlers.py) ---


class OrmHooksHandler(BehaviorHandler):
    """Uses the ORM in pre_dequeue and get_queryset, in the dispatcher thread."""

    def pre_dequeue(self):
        Repository.objects.exists()
        return True

    def get_queryset(self):
        return super().get_queryset().select_related("repository")


class AsyncOrmHandler(BehaviorHandler):
    """``async def handle`` using the async ORM and the execution log."""

    async def handle(self, job):
        await Event.objects.acreate(job_id=job.pk, kind="start", at=time.time())
        with self.attempt.log("async", ["echo", "async"]) as entry:
            entry.update(out=f"rows: {await Event.objects.filter(job_id=job.pk).acount()}")
        if job.behavior == "sleep":
            import asyncio

            await asyncio.sleep(job.payload.get("seconds", 1.0))
        await Event.objects.acreate(job_id=job.pk, kind="end", at=time.time())


class SavingHandler(BehaviorHandler):
    """Saves its job mid-run, as Django code does, after the worker heartbeated it."""

    def behave(self, job):
        self.attempt.wait(job.payload.get("seconds", 1.0))
        if job.payload.get("cancel_first"):  # an operator cancels it, before a heartbeat
            QueueJob.objects.filter(pk=job.pk).update(cancel=True)
        before = QueueJob.objects.get(pk=job.pk).last_heartbeat_at
        job.payload = {**job.payload, "saved": True}
        job.save()
        if QueueJob.objects.get(pk=job.pk).last_heartbeat_at < before:
            record(job.pk, "heartbeat went back")
        if self.attempt.wait(job.payload.get("after", 0.0)):
            self.attempt.raise_if_canceled()


class LockingLogHandler(BehaviorHandler):
    """Logs inside its own transaction, with its job row locked (select_for_update)."""

    def behave(self, job):
        from django.db import transaction

        with transaction.atomic():
            locked = QueueJob.objects.select_for_update().get(pk=job.pk)
            with self.attempt.log("locked", ["update", str(locked.pk)]) as entry:
                entry.update(out="inside the transaction")
            locked.payload = {**locked.payload, "locked": True}
            locked.save(update_fields=["payload"])
            time.sleep(job.payload.get("hold", 0.5))


class SwallowingHandler(BehaviorHandler):
    """With interrupt_on_cancel: logs in a busy loop, and swallows errors like
    ``except Exception`` code does (and once even ``BaseException``)."""

    interrupt_on_cancel = True

    def pre_handle(self, job):
        # Under coverage.py this thread runs the tracer's Python code, which holds a
        # lock between two calls: an injected exception landing there leaves it held
        # and every thread of the test process waits for it (docs/reference.md).
        sys.settrace(None)

    def handle(self, job):
        return self.behave(job)

    def behave(self, job):
        swallowed = False
        deadline = time.monotonic() + job.payload.get("seconds", 10.0)
        entry = self.attempt.log("loop", ["spin"])
        while time.monotonic() < deadline:
            try:
                entry.write(".")
                sum(range(1000))
            except Exception:  # the point: code that swallows errors
                continue
            except BaseException:
                if swallowed or not job.payload.get("swallow_once"):
                    raise
                swallowed = True
        return None


class UUIDHandler(Handler):
    """A job table keyed by UUID: heartbeats, logs, cancellation, outcomes, save()."""

    model = UUIDJob
    num_handlers = 2
    prefetch = 2
    interval = 0.05
    heartbeat_interval = 0.2
    stalled_max_age = timedelta(seconds=2)

    def handle(self, job):
        with self.attempt.log("step", "echo hello") as entry:
            entry.update(out="hello")
        if job.behavior == "sleep" and self.attempt.wait(job.payload.get("seconds", 1.0)):
            self.attempt.raise_if_canceled()
        job.payload = {**job.payload, "done": True}
        job.save()
        if job.behavior == "fail":
            raise RuntimeError("uuid boom")


class InitHandler(BehaviorHandler):
    model = InitJob


class NoHandleHandler(Handler):
    """Forgot ``handle``: every job it claimed would fail."""

    model = QueueJob


class MisspeltHandleHandler(Handler):
    model = QueueJob

    def handel(self, job):
        return None


class RepositoryIndexingHandler(Handler):
    model = RepositoryIndexingJob

    def handle(self, job):
        return None


# -- The chaos suite's ordinary handlers (tests/chaos/test_ordinary.py): three handlers
# -- with disjoint filters and different stalled_max_age on one table, and a UUID table.


def uuid_key(pk):
    """A UUID key as the event table's integer job_id."""
    return pk.int >> 65


def ordinary_post_handle(handler, job):
    """ORM work once the outcome is written, in whichever handler thread is free: it
    must see its own attempt (an event records it if not)."""
    type(job).objects.filter(pk=job.pk).values_list("state", flat=True).first()
    if handler.attempt.pk != job.pk:
        record(job.pk, "post_handle:not-its-attempt")


class OrdinarySaving(ChaosHandler):
    """ORM in pre_dequeue and get_queryset; saves its job mid-run; logs inside its own
    transaction with its row locked."""

    dequeue_filter = Q(behavior="save")
    num_handlers = 4
    heartbeat_interval = 0.25
    stalled_max_age = timedelta(seconds=3)

    def pre_dequeue(self):
        Repository.objects.exists()
        return True

    def get_queryset(self):
        return super().get_queryset().select_related("repository")

    def post_handle(self, job, outcome):
        ordinary_post_handle(self, job)

    def behave(self, job):
        from django.db import transaction

        if self.attempt.wait(job.payload.get("seconds", 0.1)):
            self.attempt.raise_if_canceled()
        job.payload = {**job.payload, "saved": job.payload.get("saved", 0) + 1}
        job.save()
        with transaction.atomic():
            type(job).objects.select_for_update().get(pk=job.pk)
            with self.attempt.log("locked", ["update", str(job.pk)]) as entry:
                entry.update(out=f"saved {job.payload['saved']}")
        self.attempt.raise_if_canceled()


class OrdinaryAsync(ChaosHandler):
    """async def handle with the async ORM."""

    dequeue_filter = Q(behavior="async")
    num_handlers = 4
    heartbeat_interval = 1.0
    stalled_max_age = timedelta(seconds=6)

    async def handle(self, job):
        import asyncio

        from asgiref.sync import sync_to_async

        attempt = self.attempt
        token = uuid.uuid4().hex
        start = asyncio.ensure_future(
            sync_to_async(record)(job.pk, "start", worker=attempt.worker_id, token=token)
        )
        try:
            await asyncio.shield(start)
            await type(job).objects.filter(pk=job.pk).aexists()
            await asyncio.sleep(job.payload.get("seconds", 0.1))
            attempt.log("async", ["sleep"], out=f"{await Repository.objects.acount()} repos")
            attempt.raise_if_canceled()
        finally:
            await start  # written even when a cancel request came during it (see above)
            await sync_to_async(record)(job.pk, "end", worker=attempt.worker_id, token=token)

    def post_handle(self, job, outcome):
        pass


class OrdinaryPlain(ChaosHandler):
    """A short stalled_max_age beside the others' longer ones on the same table."""

    dequeue_filter = Q(behavior="plain")
    num_handlers = 4
    heartbeat_interval = 0.2
    stalled_max_age = timedelta(seconds=1.5)

    def post_handle(self, job, outcome):
        ordinary_post_handle(self, job)

    def behave(self, job):
        type(job).objects.filter(pk=job.pk).exists()
        if self.attempt.wait(job.payload.get("seconds", 0.1)):
            self.attempt.raise_if_canceled()


#: Each final state kept two days: a day partition goes two days after its end.
PART_RETENTION = {state: timedelta(days=2) for state in ("completed", "failed", "canceled")}


class PartSaving(OrdinarySaving):
    """OrdinarySaving on the partitioned table (tests/chaos/test_ordinary.py)."""

    model = PartJob
    retention = PART_RETENTION


class PartAsync(OrdinaryAsync):
    model = PartJob
    retention = PART_RETENTION


class PartPlain(OrdinaryPlain):
    model = PartJob
    retention = PART_RETENTION


class PartHandler(BehaviorHandler):
    """BehaviorHandler on the partitioned table (tests/test_partitions.py)."""

    model = PartJob
    retention = PART_RETENTION


class OrdinaryUUID(ChaosHandler):
    """A job table keyed by UUID (events under ``uuid_key``)."""

    model = UUIDJob
    num_handlers = 2

    def handle(self, job):
        attempt = self.attempt
        token = uuid.uuid4().hex
        record(uuid_key(job.pk), "uuid-start", worker=attempt.worker_id, token=token)
        try:
            if attempt.wait(job.payload.get("seconds", 0.1)):
                attempt.raise_if_canceled()
            job.payload = {**job.payload, "done": True}
            job.save()
        finally:
            record(uuid_key(job.pk), "uuid-end", worker=attempt.worker_id, token=token)

    def post_handle(self, job, outcome):
        pass


class ReportHandler(Handler):
    """Unique report jobs in pausable queues: each reads and saves its row, and waits
    ``payload["seconds"]`` (0.01 by default)."""

    model = ReportJob
    queue_field = "queue"
    unique_by = ("tenant", "kind")
    num_handlers = 4
    interval = 0.05
    max_interval = 0.2
    heartbeat_interval = 0.2
    stalled_max_age = timedelta(seconds=2)

    def handle(self, job):
        ReportJob.objects.filter(tenant=job.tenant).count()
        if self.attempt.wait(job.payload.get("seconds", 0.01)):
            self.attempt.raise_if_canceled()
        job.payload = {**job.payload, "done": True}
        job.save()


class ScheduledHandler(BehaviorHandler):
    """A job every second (a row of QueueJob, behavior "tick")."""

    schedules = [Periodic("* * * * * *", fields={"behavior": "tick"}, name="every-second")]

    def behave(self, job):
        return None


class CheckinHandler(BehaviorHandler):
    """Checks in ``steps`` times, ``payload["pause"]`` seconds apart, then waits to be
    released (an Event of kind "release") before it returns."""

    def behave(self, job):
        steps = job.payload.get("steps", 3)
        for step in range(1, steps + 1):
            self.attempt.checkin(f"rows={step * 1000}", done=step, total=steps + 1)
            self.attempt.wait(job.payload.get("pause", 0.05))
        deadline = time.monotonic() + 20
        while not Event.objects.filter(job_id=job.pk, kind="release").exists():
            if time.monotonic() > deadline or self.attempt.wait(0.05):
                break


class LimitedHandler(BehaviorHandler):
    """At most 3 jobs at once across every worker, one per tenant at a time."""

    model = TenantJob
    num_handlers = 4
    max_concurrency = 3
    concurrency_key = "tenant"
    max_concurrency_per_key = 1

    def post_handle(self, job, outcome):
        pass


class RateLimitedHandler(LimitedHandler):
    """20 claims a second with a burst of 2, every worker together."""

    max_concurrency = None
    max_concurrency_per_key = None
    rate_limit = RateLimit("20/s", burst=2)


class KeyRateLimitedHandler(RateLimitedHandler):
    """5 claims a second per tenant (burst 1)."""

    rate_limit = None
    rate_limit_per_key = "5/s"


class LimitedChaosHandler(ChaosHandler):
    """The chaos suite's limits: 5 at once across the fleet, one per tenant."""

    model = TenantJob
    max_concurrency = 5
    concurrency_key = "tenant"
    max_concurrency_per_key = 1

    def post_handle(self, job, outcome):
        pass


class FairLimitedChaosHandler(LimitedChaosHandler):
    """The chaos suite's limits, with fair claims across the tenants."""

    fair_by = "tenant"


class FairHandler(BehaviorHandler):
    """Shares the claims fairly among the tenants."""

    model = TenantJob
    num_handlers = 4
    fair_by = "tenant"

    def post_handle(self, job, outcome):
        pass


class WeightedFairHandler(FairHandler):
    """Tenant 1 weighs 3, the others 1."""

    fair_weights = {1: 3}


class CallableWeightsFairHandler(FairHandler):
    """Weights from a method, as a weight kept in a table would be: tenant 1 weighs 3."""

    def fair_weights(self, tenant):
        return 3 if tenant == 1 else 1


class AsyncFairHandler(AsyncBehaviorHandler):
    """``FairHandler`` with ``async def handle``."""

    model = TenantJob
    fair_by = "tenant"


class FairLimitedHandler(LimitedHandler):
    """LimitedHandler's limits with fair claims."""

    fair_by = "tenant"


class TenantChaosHandler(LimitedChaosHandler):
    """The two-database chaos test's jobs on the second server (tests/routers.py): the
    limits above, each attempt recorded as ``tenant-start``/``tenant-end`` (events live
    on ``default``, where QueueJob's ids would collide)."""

    def handle(self, job):
        attempt = self.attempt
        token = uuid.uuid4().hex
        record(job.pk, "tenant-start", worker=attempt.worker_id, token=token)
        try:
            return self.behave(job)
        finally:
            record(job.pk, "tenant-end", worker=attempt.worker_id, token=token)


class TickingChaosHandler(ChaosHandler):
    """ChaosHandler, and a job every second by cron (``behavior`` "ok")."""

    schedules = [Periodic("* * * * * *", fields={"behavior": "ok"}, name="chaos-every-second")]


class RateLimitChaosHandler(ChaosHandler):
    """50 claims a second (the default burst: 3) by every worker together."""

    model = TenantJob
    rate_limit = "50/s"

    def post_handle(self, job, outcome):
        pass


class LimitedReportHandler(ReportHandler):
    """Limits keyed by a text field (the admin shows its busiest values)."""

    max_concurrency = 4
    concurrency_key = "tenant"
    max_concurrency_per_key = 2


class CommandHandler(BehaviorHandler):
    """Runs a program as the tutorial's handler runs ``git clone``: ``sleep
    payload["seconds"]``; a program that did not exit 0 errors the job."""

    max_num_retries = 0

    def behave(self, job):
        record(job.pk, "command_started")
        done = subprocess.run(["sleep", str(job.payload.get("seconds", 2))], check=False)
        record(job.pk, f"command_exit:{done.returncode}")
        if done.returncode:
            raise RuntimeError(f"sleep exited with {done.returncode}")


class SlowRetryHandler(BehaviorHandler):
    """Retries a second after an error: a retry that is due later, not at once."""

    retry_after = 1.0


class SlowPollHandler(BehaviorHandler):
    """Polls every 30 s: a job started sooner was woken by a notification."""

    interval = 30
    max_interval = 30


class BackoffHandler(BehaviorHandler):
    """Polls every 0.5 s while busy and backs off to 30 s while idle: an idle worker that
    starts a job within a second without a wake-up polls fast."""

    interval = 0.5
    max_interval = 30


class PoolerChaosHandler(ChaosHandler):
    """The pooler-restart chaos test's handler (tests/chaos/test_pooler_restart.py):
    2 at once across the fleet, as in the run of issue 42 that saw 3."""

    model = TenantJob
    max_concurrency = 2

    def post_handle(self, job, outcome):
        pass
