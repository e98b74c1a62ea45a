"""Running one attempt: the hooks in order, the outcome decided, post_handle once the
outcome is written. Called by an executor in the thread that runs the attempt."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync, sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import close_old_connections

from .. import conf, middleware
from ..exceptions import CancelReason, JobCanceled, NonRetryableError, Snooze
from ..handler import Handler, set_current_attempt
from ..sql.orm import orm_used
from .logs import extra
from .outcome import Outcome, failure_message
from .snoozing import snoozed

if TYPE_CHECKING:
    from .attempt import Attempt
    from .lane import Lane

logger = logging.getLogger("django_dbworker.lane")


def decide(
    handler: Handler,
    reason: CancelReason | None,
    error: BaseException | None,
    num_failures: int,
    max_runtime: float | None,
    job: Any = None,
    *,
    running: bool = False,
) -> Outcome:
    """The outcome of an attempt at ``job`` that ended with ``error`` (None: it returned),
    after a cancel request for ``reason`` (None: none), for a job that failed
    ``num_failures`` times before; ``running``: past its maximum runtime and grace, the
    handler has not returned and is written off. Pure: what the row then takes is the
    statement's to say (a cancel flag set meanwhile makes an error ``canceled``)."""
    if reason is CancelReason.LOST:
        return Outcome.lost(error)
    if error is None and reason is not CancelReason.TIMEOUT:
        return Outcome.completed()
    if reason is CancelReason.CANCELED:
        return Outcome.canceled("canceled while running", error)
    if reason is CancelReason.SHUTDOWN:
        return Outcome.requeued("requeued: the worker shut down", error)
    if reason is CancelReason.NO_HEARTBEAT:
        return Outcome.requeued("requeued: the worker could not heartbeat its jobs", error)
    if isinstance(error, Snooze) and reason is None:
        return snoozed(handler, error, job)
    non_retryable = False
    if reason is CancelReason.TIMEOUT:
        # Past the limit the attempt errors, even if the handler returns after it: its
        # work was not done within the time the job was given.
        message = f"exceeded the maximum runtime of {max_runtime:g}s (maximum_runtime_per_job)"
        if running:
            message += (
                "; the handler did not stop when asked: its thread was left running, and "
                "nothing it does from now on is written"
            )
        elif error is None:
            message += "; the handler returned after it"
        else:
            message += f"\n\n{failure_message(error)}"
        error = error or TimeoutError(message)
    else:
        assert error is not None
        message = failure_message(error)
        try:
            non_retryable = not handler.is_retryable(error)
        except Exception:
            logger.exception("%s: is_retryable raised; retrying", handler.get_name())
    retry_delay = handler.retry_delay(num_failures + 1, job)
    budget = handler.retry_budget(job)
    if non_retryable or num_failures >= budget:
        return Outcome.failed(
            error, message, non_retryable=non_retryable, retry_delay=retry_delay, budget=budget
        )
    return Outcome.errored(error, message, retry_delay, budget)


class Execution:
    """Runs the attempts of one lane (``run`` is what its executor calls)."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.handler = lane.handler
        self._warned_return = False
        #: Close the thread's Django connections after each job like after a request (not
        #: when the attempt runs in a caller's transaction: the testing helpers).
        self.recycle = True
        self._pre_handle = type(self.handler).pre_handle is not Handler.pre_handle
        self._post_handle = self.handler.uses_post_handle()
        #: Where a thread-served lane runs ``post_handle`` once the outcome is written
        #: (``ThreadExecutor.call_soon``); None: the attempt's thread waits for the write
        #: and runs it (the testing helpers).
        self.post_later: Callable[[Callable[[], None]], None] | None = None
        #: Whether each hook (its function) is ``async def``: looked up once.
        self._is_async: dict[Any, bool] = {}
        #: The middleware onion around the hooks (``django_dbworker.middleware``).
        entries = [*conf.get("MIDDLEWARE"), *self.handler.middleware]
        factories = middleware.load(entries)
        if lane.asynchronous:
            self._attempt_async = middleware.chain_async(factories, self._hooks_async)
        else:
            self._attempt = middleware.chain(factories, self._hooks)

    def run(self, attempt: Attempt) -> None:
        """Run ``attempt`` in the calling thread (a handler thread, or the test's)."""
        if not self._begin(attempt):
            return
        outcome: Outcome | None = None  # should our own code fail: the resetter's job
        try:
            result, error = None, None
            try:
                with attempt.interruptible():
                    result = self._attempt(attempt.job, attempt)
            except BaseException as exc:
                error = exc
            outcome = self._decided(attempt, result, error)
            if self._post_handle:
                # post_handle sees the state the row took (or "lost"), not a guess.
                if self.post_later is None:
                    self.lane.wait_written(attempt)
                    self._post(attempt, outcome)
                else:  # the thread is free for the next job meanwhile
                    self.lane.post_later()
                    post = self.post_later
                    attempt.on_written(lambda: post(lambda: self._post_deferred(attempt, outcome)))
        finally:
            self._end(attempt, outcome, recycle=self.recycle and orm_used())

    def _post(self, attempt: Attempt, outcome: Outcome) -> None:
        outcome.state = attempt.written_state or "lost"
        try:
            self.call(attempt, self.handler.post_handle, attempt.job, outcome)
        except Exception:
            self._post_failed(attempt)

    def _post_deferred(self, attempt: Attempt, outcome: Outcome) -> None:
        """``post_handle`` in a handler thread, once the outcome is written."""
        set_current_attempt(attempt)
        try:
            self._post(attempt, outcome)
        finally:
            set_current_attempt(None)
            try:
                if self.recycle and orm_used():
                    close_old_connections()
            finally:
                self.lane.post_done()

    async def run_async(self, attempt: Attempt) -> None:
        """Run ``attempt`` as a coroutine on the asyncio executor's loop: ``handle`` is
        awaited as the task a cancel request cancels; sync hooks go to asgiref's sync
        thread (plain middleware to a pool thread: ``middleware.chain_async``)."""
        if not self._begin(attempt):
            return
        outcome: Outcome | None = None
        try:
            result, error = None, None
            attempt.bind_task(asyncio.current_task())
            try:
                result = await self._attempt_async(attempt.job, attempt)
            except BaseException as exc:
                error = exc
            finally:
                attempt.bind_task(None)
            outcome = self._decided(attempt, result, error)
            if self._post_handle:
                await self.lane.wait_written_async(attempt)
                outcome.state = attempt.written_state or "lost"
                try:
                    await self._acall(self.handler.post_handle, attempt.job, outcome)
                except Exception:
                    self._post_failed(attempt)
        finally:
            self._end(attempt, outcome, recycle=False)  # the executor recycles

    def _begin(self, attempt: Attempt) -> bool:
        """Whether to run ``attempt``; if not, its outcome is handed over already."""
        lane = self.lane
        if not attempt.begin():
            lane.started(attempt)
            if attempt.withdrawn:  # given back while it waited: requeued already
                return False
            # Cancelled (or lost) before it began: its outcome, without running.
            attempt.finished = True
            lane.submit(attempt, self.decide(attempt, JobCanceled(attempt.cancel_reason)))
            lane.slot_free()
            return False
        set_current_attempt(attempt)
        lane.callbacks.started(attempt)
        return True

    def _decided(self, attempt: Attempt, result: Any, error: BaseException | None) -> Outcome:
        """The outcome of an attempt that returned ``result`` or raised ``error``,
        handed to the writer."""
        if error is None:
            if isinstance(result, BaseException):
                error = result
            elif self.handler.result_field is not None:
                try:
                    attempt.result = self._stored(result)
                except NonRetryableError as exc:
                    error = exc
            elif result is not None:
                self._warn_return(result)
        try:
            outcome = self.decide(attempt, error)
        except Exception as exc:  # a bug of ours, or an override that raises: not "lost"
            logger.exception(
                "job %s: deciding its outcome raised; failing it",
                attempt.label,
                extra=extra("decide_failed", worker=self.lane.worker_id, job=attempt.pk),
            )
            message = failure_message(exc, "deciding the outcome of this attempt failed: ")
            outcome = Outcome.failed(exc, message, non_retryable=True)
        if error is None:
            outcome.result = attempt.result
        outcome.duration = time.monotonic() - attempt.started
        with attempt._lock:
            abandoned = attempt.abandoned
            attempt.finished = True
        if abandoned and attempt.written_off is not None:
            # Written off past its maximum runtime: that outcome stands (and is what
            # post_handle sees); what the handler did after it is dropped.
            logger.warning(
                "job %s: its handler returned %.1fs after it was written off past its "
                "maximum runtime; what it did then is dropped",
                attempt.label,
                outcome.duration,
                extra=extra("abandoned_returned", worker=self.lane.worker_id, job=attempt.pk),
            )
            return attempt.written_off
        self.lane.submit(attempt, outcome)
        return outcome

    def _post_failed(self, attempt: Attempt) -> None:
        logger.exception(  # noqa: LOG004 (called from the except clauses)
            "job %s: post_handle raised",
            attempt.label,
            extra=extra("post_handle_failed", worker=self.lane.worker_id, job=attempt.pk),
        )

    def _end(self, attempt: Attempt, outcome: Outcome | None, *, recycle: bool) -> None:
        lane = self.lane
        lane.started(attempt)
        lane.callbacks.ended(attempt)
        set_current_attempt(None)
        attempt.finished = True
        try:
            if recycle:
                close_old_connections()
        finally:
            if outcome is None and not attempt.abandoned:
                lane.submit(attempt, Outcome.lost())
            if attempt.abandoned:
                with lane.lock:
                    lane.abandoned -= 1
            lane.slot_free()

    def _hooks(self, job: Any, attempt: Attempt) -> Any:
        """The centre of the middleware onion: ``pre_handle``, then ``handle``."""
        if self._pre_handle:
            try:
                self.call(attempt, self.handler.pre_handle, job)
            finally:
                self.lane.started(attempt)
        return self.call(attempt, self.handler.handle, job)

    async def _hooks_async(self, job: Any, attempt: Attempt) -> Any:
        """The centre of the async middleware onion."""
        if self._pre_handle:
            try:
                await self._acall(self.handler.pre_handle, job)
            finally:
                self.lane.started(attempt)
        return await self._acall(self.handler.handle, job)

    async def _acall(self, hook: Any, *args: Any) -> Any:
        """Await an ``async def`` hook; run a sync one in asgiref's sync thread (where
        Django's async ORM runs too), never on the event loop."""
        if self._async(hook):
            return await hook(*args)
        result = await sync_to_async(hook, thread_sensitive=True)(*args)
        if result is not None and inspect.isawaitable(result):
            return await result
        return result

    def _async(self, hook: Any) -> bool:
        function = getattr(hook, "__func__", hook)
        is_async = self._is_async.get(function)
        if is_async is None:
            is_async = self._is_async[function] = inspect.iscoroutinefunction(hook)
        return is_async

    def decide(
        self, attempt: Attempt, error: BaseException | None, *, running: bool = False
    ) -> Outcome:
        return decide(
            self.handler,
            attempt.cancel_reason,
            error,
            attempt.job.num_failures,
            attempt.max_runtime,
            attempt.job,
            running=running,
        )

    def _stored(self, result: Any) -> str:
        """A return value as the JSON text ``result_field`` stores, or a clear error."""
        if result is None:
            return "null"
        try:
            # The default encoder first: the same text for what it can encode, several
            # times faster than a new DjangoJSONEncoder (dates, decimals, UUIDs) per job.
            return json.dumps(result)
        except (TypeError, ValueError):
            pass
        try:
            return json.dumps(result, cls=DjangoJSONEncoder)
        except (TypeError, ValueError):
            raise NonRetryableError(
                f"{self.handler.get_name()}: handle() returned a "
                f"{type(result).__module__}.{type(result).__qualname__}, which is not "
                f"JSON-serialisable ({self.handler.result_field} stores it as JSON)"
            ) from None

    def call(self, attempt: Attempt, hook: Any, *args: Any) -> Any:
        """Call a hook; an ``async def`` hook (or one returning an awaitable) runs to its
        end on an event loop of its own, its ORM calls in this thread (whose connection
        is recycled between jobs like any other), cancelled as a task on a cancel request.
        """
        if self._async(hook):
            return async_to_sync(_as_task)(attempt, hook(*args))
        result = hook(*args)
        if result is not None and inspect.isawaitable(result):
            return async_to_sync(_as_task)(attempt, result)
        return result

    def _warn_return(self, result: Any) -> None:
        if not self._warned_return:
            self._warned_return = True
            logger.warning(
                "%s: handle() returned %r; return values are ignored",
                self.lane.label,
                type(result).__name__,
            )


async def _as_task(attempt: Attempt, awaitable: Any) -> Any:
    """Await ``awaitable`` as the task a cancel request of ``attempt`` cancels."""
    attempt.bind_task(asyncio.current_task())
    try:
        return await awaitable
    finally:
        attempt.bind_task(None)
