"""One attempt at a job: its cancellation state and its execution log."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..exceptions import CancelReason, JobCanceled
from .atomic import Completion
from .execlog import ExecutionLog, LogEntry, as_command, as_text
from .logs import extra

__all__ = ["Attempt", "LogEntry", "as_command", "as_text"]

#: Longest text a check-in keeps.
MAX_CHECKIN_TEXT = 200

if TYPE_CHECKING:
    from .lane import Lane
    from .outcome import Outcome

logger = logging.getLogger("django_dbworker.attempt")


class Attempt(Completion):
    """The running of one claimed job by one handler thread."""

    # What most attempts never change is set here, on the class, not per attempt: each
    # no-op job makes an attempt, and twenty attribute writes were a share of its cost.
    cancel_reason: CancelReason | None = None
    finished = False
    #: A handler thread took it (a prefetched attempt waits until then).
    begun = False
    #: Withdrawn before a thread took it: requeued unrun.
    withdrawn = False
    #: Counted in its lane's ``starting`` until its pre_handle is done.
    starting = False
    #: The job was claimed after the resetter brought it back (counted while held).
    was_reset = False
    thread_id: int | None = None
    _event: threading.Event | None = None  # made on first wait(): most never do
    _interruptible = False
    _injected = False
    _interrupted_at = 0.0
    _task: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None
    #: The log changed since the writer last took it.
    logs_pending = False
    #: Past its maximum runtime and grace, the handler had not returned: its outcome
    #: (``written_off``) was written without it, and its thread left running.
    abandoned = False
    written_off: Outcome | None = None
    #: Once the outcome is written or refused (``mark_written``): the state the row
    #: took (None: refused, the job was no longer ours).
    written_state: str | None = None
    _written = False
    _written_event: threading.Event | None = None  # made for waiters only
    _written_future: asyncio.Future[None] | None = None  # for a coroutine
    _on_written: Callable[[], None] | None = None  # a deferred post_handle
    #: What ``handle()`` returned, as JSON text (handlers with a ``result_field``).
    result: str | None = None
    #: The last check-in (``checkin()``), whether no statement took it yet, and the
    #: last one known written.
    progress: dict[str, Any] | None = None
    _progress_pending = False
    _progress_written: dict[str, Any] | None = None

    def __init__(self, job: Any, lane: Lane) -> None:
        self.job = job
        self.pk: Any = job.pk
        self.lane = lane
        self.started = time.monotonic()
        #: When the claim that took the job began (monotonic): its heartbeat's time.
        self.claimed_at: float = getattr(lane, "claim_began", self.started)
        self._lock = threading.Lock()
        #: The execution log as the row holds it once written (the claim emptied it);
        #: the job's own list, so ``job.execution_logs`` shows it too.
        logs = getattr(job, "execution_logs", None)
        if not isinstance(logs, list) or logs:
            logs = []
        self.logs: list[dict[str, Any]] = logs
        self._log = ExecutionLog(logs, self._lock, self._logs_changed)
        #: Seconds this attempt may run (``Handler.maximum_runtime``), None: no limit.
        self.max_runtime = lane.max_runtime_of(job)

    def __repr__(self) -> str:
        return f"<Attempt {self.lane.label}:{self.pk}>"

    @property
    def label(self) -> str:
        """``app_label.Model:pk``, as logs name the job."""
        return self.lane.job_label(self.pk)

    @property
    def worker_id(self) -> str:
        """The worker process running this attempt (what ``worker_hostname`` holds)."""
        return self.lane.worker_id

    # -- cancellation ----------------------------------------------------------------

    @property
    def canceled(self) -> bool:
        """True once the attempt was asked to stop (see ``cancel_reason``)."""
        return self.cancel_reason is not None

    def raise_if_canceled(self) -> None:
        if self.cancel_reason is not None:
            raise JobCanceled(self.cancel_reason)

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; return True at once if asked to stop."""
        with self._lock:
            if self.cancel_reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def begin(self) -> bool:
        """A handler thread takes the attempt; False if it was withdrawn before."""
        with self._lock:
            if self.withdrawn:
                return False
            self.begun = True
            self.started = time.monotonic()
            return self.cancel_reason is None

    def withdraw(self) -> bool:
        """Withdraw a prefetched attempt no thread has begun; True if it was (the caller
        then requeues it untouched, and no thread will run it)."""
        with self._lock:
            if self.begun or self.withdrawn:
                return False
            self.withdrawn = True
            self.finished = True
            if self.cancel_reason is None:
                self.cancel_reason = CancelReason.SHUTDOWN
            return True

    def request_cancel(self, reason: CancelReason) -> None:
        with self._lock:
            if self.finished:
                return
            if self.cancel_reason is not None and reason is not CancelReason.LOST:
                return
            first = self.cancel_reason is None
            self.cancel_reason = reason
            if self._event is not None:
                self._event.set()
            if first:
                logger.info(
                    "job %s: stopping attempt (%s)",
                    self.label,
                    reason.value,
                    extra=extra(
                        "cancel",
                        worker=self.lane.worker_id,
                        job=self.pk,
                        handler=self.lane.label,
                        reason=reason.value,
                    ),
                )
            self._interrupt()

    def reinterrupt(self, min_gap: float) -> None:
        """Inject ``JobCanceled`` again into a handler thread that swallowed it and runs
        on, at most every ``min_gap`` seconds (the heartbeat calls this while a cancelled
        attempt goes on). A coroutine is cancelled once: asyncio code that catches
        ``CancelledError`` (to clean up, say) decides for itself."""
        with self._lock:
            if self.finished or self.cancel_reason is None or self._task is not None:
                return
            if time.monotonic() - self._interrupted_at >= min_gap:
                self._injected = False
                self._interrupt()

    def _interrupt(self) -> None:
        """Stop the handler now, if it can be: cancel its coroutine (async handlers), or
        inject ``JobCanceled`` into its thread (``interrupt_on_cancel``). Holds _lock."""
        if self._task is not None:
            loop, task = self._task
            self._interrupted_at = time.monotonic()
            loop.call_soon_threadsafe(task.cancel)
        elif self._interruptible and not self._injected and self.thread_id is not None:
            self._interrupted_at = time.monotonic()
            self._injected = _async_raise(self.thread_id, JobCanceled)

    def bind_task(self, task: asyncio.Task[Any] | None) -> None:
        """The coroutine running this attempt's hooks (cancelled on a cancel request)."""
        with self._lock:
            self._task = (task.get_loop(), task) if task is not None else None
            if task is not None and self.cancel_reason is not None:
                task.cancel()

    def mark_written(self, state: str | None) -> None:
        """The writer wrote the outcome (``state``), or could not (None)."""
        with self._lock:
            self.written_state = state
            self._written = True
            event, future = self._written_event, self._written_future
            then, self._on_written = self._on_written, None
        if event is not None:
            event.set()
        if future is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: no one waits
                future.get_loop().call_soon_threadsafe(_resolve, future)
        if then is not None:
            then()

    @property
    def written(self) -> bool:
        """Whether the outcome was written (or refused): nothing more of this attempt
        reaches the row."""
        return self._written

    def on_written(self, then: Callable[[], None]) -> None:
        """Call ``then()`` once ``mark_written`` was called (at once if it was; else in
        the writer's thread: ``then`` must only hand work on)."""
        with self._lock:
            if not self._written:
                self._on_written = then
                return
        then()

    def wait_written(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``mark_written``; whether it happened."""
        with self._lock:
            if self._written:
                return True
            if self._written_event is None:
                self._written_event = threading.Event()
            event = self._written_event
        return event.wait(timeout)

    def written_future(self) -> asyncio.Future[None]:
        """A future of the running loop done once ``mark_written`` was called."""
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._written:
                future.set_result(None)
            else:
                self._written_future = future
        return future

    def interruptible(self) -> contextlib.AbstractContextManager[None]:
        """While active, a cancel request injects ``JobCanceled`` into this thread, if
        the handler asks for it (``interrupt_on_cancel``)."""
        if self.lane.handler.interrupt_on_cancel:
            return _Interruptible(self)
        return _UNINTERRUPTIBLE

    # -- progress --------------------------------------------------------------------

    def checkin(
        self, text: str | None = None, *, done: float | None = None, total: float | None = None
    ) -> None:
        """Report progress: a short text (``"rows=335000"``) and/or ``done`` of
        ``total``. Written with the next heartbeat (no statement of its own) or, if the
        attempt ends first, just before its outcome; shown in
        the admin and ``dbworker_status``; each check-in replaces the previous one."""
        for name, value in (("done", done), ("total", total)):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ValueError(f"checkin({name}=...) must be a finite number, not {value!r}")
        entry = {
            "text": None if text is None else str(text)[:MAX_CHECKIN_TEXT],
            "done": done,
            "total": total,
            "at": datetime.now(UTC).isoformat(),
        }
        with self._lock:
            self.progress = entry
            self._progress_pending = True

    def take_progress(self) -> dict[str, Any] | None:
        """The check-in the row still lacks, if any (heartbeat thread)."""
        with self._lock:
            if not self._progress_pending:
                return None
            self._progress_pending = False
            return self.progress

    def progress_unwritten(self) -> None:
        """The heartbeat could not write the check-in it took: write it next time."""
        with self._lock:
            self._progress_pending = True

    def progress_written(self, entry: dict[str, Any]) -> None:
        """The row holds check-in ``entry``."""
        with self._lock:
            self._progress_written = entry

    def unwritten_progress(self) -> dict[str, Any] | None:
        """The last check-in unless the row is known to hold it (taken by a heartbeat
        still under way, or not taken yet): what the writer writes before the outcome."""
        progress = self.progress  # most attempts never check in: no lock for them
        if progress is None or progress is self._progress_written:
            return None
        with self._lock:
            self._progress_pending = False
            return self.progress

    # -- execution log ---------------------------------------------------------------

    def log(
        self,
        key: str,
        command: str | bytes | Iterable[str | bytes] = (),
        out: str | bytes = "",
    ) -> LogEntry:
        """Append an execution-log entry and return it for updates.

        ``command`` is a list of arguments, or one command line as a string. The
        entry is written at once by the worker's writer thread: logging never waits
        for the database, works from ``async def`` code and inside the handler's own
        transaction, even one that has locked the job row (the write then waits for
        that lock without holding up anything else).
        """
        arguments = as_command(command)
        with self._lock:
            entry = self._log.add(key, arguments, out)
        self._logs_changed()
        return entry

    def _logs_changed(self) -> None:
        with self._lock:
            if self.logs_pending:
                return
            self.logs_pending = True
        self.lane.logs_changed(self)

    def logs_unwritten(self) -> None:
        """The writer could not write the log it took: it is still to be written."""
        with self._lock:
            self.logs_pending = True

    def take_logs(self) -> str | None:
        """The log as JSON if it changed since last taken (writer thread)."""
        with self._lock:
            if not self.logs_pending:
                return None
            self.logs_pending = False
            return json.dumps(self.logs)


class _Interruptible:
    """While active, cancellation may inject ``JobCanceled`` into the handler thread."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt

    def __enter__(self) -> None:
        attempt = self.attempt
        with attempt._lock:
            attempt.thread_id = threading.get_ident()
            attempt._interruptible = True
            if attempt.cancel_reason is not None:
                raise JobCanceled(attempt.cancel_reason)

    def __exit__(self, *exc_info: object) -> None:
        attempt = self.attempt
        with attempt._lock:
            attempt._interruptible = False
            if attempt._injected and attempt.thread_id is not None:
                # Revoke an injected exception that has not fired yet.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(attempt.thread_id), None)


#: What ``interruptible()`` is for a handler that is never interrupted (the default).
_UNINTERRUPTIBLE = contextlib.nullcontext()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _async_raise(thread_id: int, exc_type: type[BaseException]) -> bool:
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type)
    )
    return bool(done == 1)
