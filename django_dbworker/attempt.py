"""One attempt at a job: its cancellation state, its execution log and its outcome."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import conf
from .exceptions import CancelReason, JobCanceled

if TYPE_CHECKING:
    from .lane import Lane

logger = logging.getLogger(__name__)


def clean_text(text: str, limit: int) -> str:
    """Text fit for a text/JSON column: no NUL, at most ``limit`` characters."""
    text = text.replace("\x00", "\ufffd")
    if len(text) > limit:
        cut = len(text) - limit
        text = text[:limit] + f"\n… [{cut} more characters cut]"
    return text


def as_text(value: str | bytes) -> str:
    """Output as text; bytes that are not UTF-8 are replaced, never refused."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def failure_message(error: BaseException, prefix: str = "") -> str:
    """``Type: message`` on the first line, then the traceback; capped."""
    try:
        text = str(error)
    except Exception as exc:  # a broken __str__ must not cost the job its outcome
        text = f"<str() failed: {type(exc).__name__}>"
    head = f"{prefix}{type(error).__name__}: {text}" if text else f"{prefix}{type(error).__name__}"
    body = "".join(traceback.format_exception(error))
    return clean_text(f"{head}\n\n{body}", conf.get("MAX_FAILURE_MESSAGE_LENGTH"))


@dataclasses.dataclass
class Outcome:
    """What the worker writes for an attempt, as ``post_handle`` sees it.

    ``state`` is one of ``completed``, ``errored``, ``failed``, ``canceled``,
    ``queued`` (requeued at shutdown) or ``lost`` (the row is no longer ours:
    nothing is written).
    """

    state: str
    error: BaseException | None = None
    message: str | None = None
    retry_delay: float = 0.0
    non_retryable: bool = False
    duration: float = 0.0


class LogEntry:
    """An execution-log entry. Every change is written to the job row at once."""

    def __init__(self, attempt: Attempt, key: str, command: Sequence[str], out: str) -> None:
        self._attempt = attempt
        self._started = time.monotonic()
        self.index: int | None = None
        self.data: dict[str, Any] = {
            "key": key,
            "command": [as_text(c) for c in command],
            "start_time": datetime.now(UTC).isoformat(),
            "exit_code": None,
            "out": self._clean(out),
            "duration_ms": None,
        }

    @staticmethod
    def _clean(out: str | bytes) -> str:
        return clean_text(as_text(out), conf.get("MAX_LOG_OUTPUT_LENGTH"))

    def update(
        self,
        *,
        out: str | bytes | None = None,
        exit_code: int | None = None,
        duration_ms: int | None = None,
    ) -> None:
        """Replace the output and/or set exit code and duration."""
        if out is not None:
            self.data["out"] = self._clean(out)
        if exit_code is not None:
            self.data["exit_code"] = int(exit_code)
        if duration_ms is not None:
            self.data["duration_ms"] = int(duration_ms)
        self._attempt.lane.write_log(self._attempt, self)

    def write(self, text: str | bytes) -> None:
        """Append to the output."""
        self.update(out=self.data["out"] + as_text(text))

    def finish(self, exit_code: int = 0, out: str | bytes | None = None) -> None:
        """Set the exit code and the duration measured since the entry began."""
        self.update(
            out=out,
            exit_code=exit_code,
            duration_ms=round((time.monotonic() - self._started) * 1000),
        )

    def __enter__(self) -> LogEntry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.data["duration_ms"] is None:
            self.finish(exit_code=self.data["exit_code"] or (1 if exc_type else 0))


class Attempt:
    """The running of one claimed job by one handler thread."""

    def __init__(self, job: Any, lane: Lane) -> None:
        self.job = job
        self.pk: int = job.pk
        self.lane = lane
        self.started = time.monotonic()
        self.cancel_reason: CancelReason | None = None
        self.finished = False
        #: A handler thread took it (a prefetched attempt waits until then).
        self.begun = False
        self.thread_id: int | None = None
        self._event: threading.Event | None = None  # made on first wait(): most never do
        self._lock = threading.Lock()
        self._interruptible = False
        self._injected = False

    def __repr__(self) -> str:
        return f"<Attempt {self.lane.label}:{self.pk}>"

    @property
    def worker_id(self) -> str:
        """The worker process running this attempt (what ``worker_hostname`` holds)."""
        return self.lane.worker.worker_id

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
            self.begun = True
            self.started = time.monotonic()
            return self.cancel_reason is None

    def withdraw(self) -> None:
        """Cancel a prefetched attempt no thread has begun (it is requeued untouched)."""
        with self._lock:
            if not self.begun and self.cancel_reason is None:
                self.cancel_reason = CancelReason.SHUTDOWN
                if self._event is not None:
                    self._event.set()

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
                    self.lane.job_label(self.pk),
                    reason.value,
                    extra={"job_id": self.pk, "reason": reason.value},
                )
            if self._interruptible and not self._injected and self.thread_id is not None:
                self._injected = _async_raise(self.thread_id, JobCanceled)

    def interruptible(self) -> _Interruptible:
        return _Interruptible(self)

    # -- execution log ---------------------------------------------------------------

    def log(self, key: str, command: Sequence[str] = (), out: str = "") -> LogEntry:
        """Append an execution-log entry (written at once) and return it for updates."""
        entry = LogEntry(self, key, command, out)
        self.lane.write_log(self, entry)
        return entry


class _Interruptible:
    """While active, cancellation may inject ``JobCanceled`` into the handler thread."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt

    def __enter__(self) -> None:
        attempt = self.attempt
        with attempt._lock:
            attempt.thread_id = threading.get_ident()
            attempt._interruptible = attempt.lane.handler.interrupt_on_cancel
            if attempt._interruptible and attempt.cancel_reason is not None:
                raise JobCanceled(attempt.cancel_reason)

    def __exit__(self, *exc_info: object) -> None:
        attempt = self.attempt
        with attempt._lock:
            attempt._interruptible = False
            if attempt._injected and attempt.thread_id is not None:
                # Revoke an injected exception that has not fired yet.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(attempt.thread_id), None)


def _async_raise(thread_id: int, exc_type: type[BaseException]) -> bool:
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type)
    )
    return bool(done == 1)
