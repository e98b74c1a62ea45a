"""Exceptions handlers raise or receive."""

from __future__ import annotations

import datetime
import enum
import math


class NonRetryableError(Exception):
    """Raise from a handler to fail the job at once, whatever its retry budget."""


class CancelReason(enum.Enum):
    """Why a running attempt was asked to stop."""

    #: ``cancel`` was set on the row (admin or ORM): the job ends ``canceled``.
    CANCELED = "canceled"
    #: The row was deleted, or reset and taken by another attempt: nothing is written.
    LOST = "lost"
    #: ``maximum_runtime_per_job`` passed: the job ends ``errored`` (or ``failed``).
    TIMEOUT = "timeout"
    #: The worker is shutting down past its grace period: the job is requeued.
    SHUTDOWN = "shutdown"
    #: The worker could not heartbeat for most of ``stalled_max_age`` (the database
    #: is out of its reach): the job is requeued if it still can be, before the
    #: resetter hands it to another worker.
    NO_HEARTBEAT = "no heartbeat"


class JobCanceled(BaseException):
    """Raised inside a handler whose attempt was asked to stop.

    Handlers get it from ``self.attempt.raise_if_canceled()``, or injected into
    the handler thread when the handler sets ``interrupt_on_cancel = True``.
    Like ``asyncio.CancelledError`` it is a ``BaseException``: an ``except
    Exception`` in the handler (or in a library it calls) does not swallow it.
    """

    def __init__(self, reason: CancelReason | None = None) -> None:
        super().__init__(
            f"job attempt stopped: {reason.value}" if reason else "job attempt stopped"
        )
        self.reason = reason


class WorkerStartError(RuntimeError):
    """A worker could not start (its handler threads, say); it claimed nothing."""


class Snooze(Exception):
    """Raise from a handler to put the job back in the queue for ``seconds`` (a number
    or a ``timedelta``): it is claimed again once they pass, its retries untouched.

    A snooze is not a failure: ``num_failures`` and the retry budget stay as they are,
    and a later error's backoff counts failures only. Each snooze adds one to
    ``num_snoozes``; past the handler's ``max_snoozes`` the job fails instead. Raise it
    from ``handle()`` (sync or async) or from a ``django.tasks`` task function. A
    cancel requested while the attempt ran wins: the job ends ``canceled``.
    """

    def __init__(self, seconds: float | datetime.timedelta = 0) -> None:
        if isinstance(seconds, datetime.timedelta):
            seconds = seconds.total_seconds()
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"Snooze takes seconds or a timedelta, not {seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"Snooze takes a finite number of seconds >= 0, not {seconds!r}")
        self.seconds = float(seconds)
        super().__init__(f"snoozed for {self.seconds:g}s")


class WaitTimeout(TimeoutError):
    """``job.wait(timeout)`` (or its async form) gave up: the job had not reached a final
    state (completed, failed, canceled) within ``timeout`` seconds."""
