"""Attempts past their maximum runtime (``maximum_runtime_per_job``, or
``Handler.maximum_runtime(job)``), counted from when a handler thread began them.

At the limit the attempt is asked to stop (``CancelReason.TIMEOUT``): its coroutine is
cancelled, ``interrupt_on_cancel`` injects ``JobCanceled``, ``attempt.canceled`` turns
true. Whatever the handler does then, the attempt errors (fails once its retries are
spent): a return after the limit does not complete the job.

A handler that has not returned ``maximum_runtime_grace`` after the limit (a busy
loop that never looks, a blocking call, a coroutine that swallows its cancellation)
is written off: the worker writes that outcome without it, which releases the job to
its retry (by this worker or another, after its retry delay). Its thread runs on:

- it keeps its slot (the lane runs one thread, or coroutine, fewer) until it returns;
  then ``post_handle`` runs with the outcome written, and the thread takes jobs again;
- nothing it does through its attempt reaches the row any more: the writer drops the
  execution log of an attempt whose outcome is written and its return value or error
  is dropped (a retry this worker claims has the same worker id, so the statements'
  fence alone would not tell the two attempts apart); its own queries are its own;
- a stopping worker does not wait for it (its job is finished): the process exits
  with the thread still running.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..exceptions import CancelReason
from .logs import extra
from .outcome import Outcome, failure_message

if TYPE_CHECKING:
    from .attempt import Attempt
    from .lane import Lane

logger = logging.getLogger("django_dbworker.lane")

#: The cancel requests after which an attempt past its runtime and grace is written
#: off. Not LOST (nothing to write: the row is no longer its own), SHUTDOWN or
#: NO_HEARTBEAT (the stopping worker, the resetter see to those).
WRITTEN_OFF = frozenset({CancelReason.TIMEOUT, CancelReason.CANCELED})


def check_runtimes(lane: Lane, now: float) -> None:
    """Ask attempts past their maximum runtime to stop; write off those past it and
    its grace (heartbeat thread, at each tick)."""
    if lane.max_runtime is None and not lane.runtime_per_job:
        return
    for attempt in lane.running():
        limit = attempt.max_runtime
        if limit is None or not attempt.begun:  # a prefetched job waiting is not running
            continue
        over = now - attempt.started - limit
        if over > 0:
            attempt.request_cancel(CancelReason.TIMEOUT)
        if over > lane.max_runtime_grace:
            write_off(lane, attempt)


def write_off(lane: Lane, attempt: Attempt) -> bool:
    """Write the timed-out outcome of ``attempt`` without waiting for its handler, and
    leave its thread running; False if it ended meanwhile."""
    with attempt._lock:
        reason = attempt.cancel_reason
        if attempt.finished or not attempt.begun or reason not in WRITTEN_OFF:
            return False
        attempt.finished = True
        attempt.abandoned = True
    if reason is CancelReason.CANCELED:  # an operator's cancel came first
        outcome = Outcome.canceled(
            "canceled while running; the handler had not stopped by the end of its "
            "maximum runtime: its thread was left running"
        )
    else:
        try:
            outcome = lane.execution.decide(attempt, None, running=True)
        except Exception as exc:  # an override of retry_delay or retry_budget raised
            message = failure_message(exc, "deciding the outcome of this attempt failed: ")
            outcome = Outcome.failed(exc, message, non_retryable=True)
    outcome.duration = time.monotonic() - attempt.started
    attempt.written_off = outcome
    with lane.lock:
        lane.abandoned += 1
        left = lane.abandoned
    logger.error(
        "job %s: still running %.1fs past its maximum runtime of %gs; its outcome is "
        "written without it (%s) and its handler left running, holding its slot until it "
        "returns (%d of %d of %s's slots held so)",
        attempt.label,
        outcome.duration - (attempt.max_runtime or 0.0),
        attempt.max_runtime or 0.0,
        outcome.state,
        left,
        lane.num_handlers,
        lane.label,
        extra=extra("written_off", worker=lane.worker_id, job=attempt.pk, handler=lane.label),
    )
    lane.submit(attempt, outcome)
    return True
