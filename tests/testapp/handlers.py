"""Handlers the tests run, in threads and in runworker subprocesses.

``BehaviorHandler`` does what each job's ``behavior`` says and records what happened
in ``Event`` rows, so tests assert on the database, not on mocks.
"""

import json
import os
import signal
import threading
import time
import uuid
from datetime import timedelta

from django.db import InterfaceError, OperationalError, connection
from django.db.models import Q

from django_dbworker import Handler, NonRetryableError

from .models import Event, QueueJob


def record(job_id, kind, **fields):
    """Write an Event; ride out a database blip (chaos tests terminate connections).

    ``at`` is taken before the first try, so it is when the thing happened. A retry
    after a lost reply may write the event twice: readers keep the first.
    """
    at = time.time()
    deadline = time.monotonic() + 60
    while True:
        try:
            Event.objects.create(job_id=job_id, kind=kind, at=at, **fields)
            return
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            connection.close()
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
        record(job.pk, f"post_handle:{outcome.state}")
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


class SlowHeartbeatHandler(BehaviorHandler):
    heartbeat_interval = 0.5
    stalled_max_age = timedelta(seconds=30)


class TimeoutHandler(BehaviorHandler):
    maximum_runtime_per_job = timedelta(seconds=0.5)
    max_num_retries = 0


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


class BadOrderingHandler(BehaviorHandler):
    ordering = ("no_such_field",)
