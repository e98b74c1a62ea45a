"""What happens in a worker, told to whoever watches: the lifecycle signals, the
per-minute statistics, metrics.

The parts of the worker call one ``Events`` at the points that also log (a claim,
an attempt's start, outcomes written, a cancel seen, a failed statement); it hands
each to its observers. An observer that raises is logged and never breaks the
worker. Observers run in the calling thread: keep them cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import signals

if TYPE_CHECKING:
    from .attempt import Attempt
    from .lane import Lane
    from .outcome import Outcome

logger = logging.getLogger("django_dbworker.worker")

#: One outcome as written: the attempt, its outcome, the state the row took (None: the
#: job was no longer this worker's, nothing written).
Written = tuple["Attempt", "Outcome", str | None]


class Observer:
    """What a worker tells its observers; each method does nothing unless overridden."""

    def attach(self, lanes: Sequence[Lane]) -> None:
        """The worker starts with these lanes (main thread)."""

    def claimed(self, lane: Lane, jobs: Sequence[Any], seconds: float) -> None:
        """A claim of ``lane`` took ``jobs`` in ``seconds`` (dispatcher thread)."""

    def started(self, attempt: Attempt) -> None:
        """An attempt begins (the thread that runs it)."""

    def ended(self, attempt: Attempt) -> None:
        """The thread that ran an attempt is done with it (its outcome may not be
        written yet)."""

    def finished(self, lane: Lane, written: Sequence[Written]) -> None:
        """Outcomes of ``lane`` were written by one statement (writer thread)."""

    def canceled(self, attempt: Attempt) -> None:
        """The cancel flag of a running job was seen (heartbeat thread)."""

    def statement_failed(self, role: str) -> None:
        """A statement of the worker's own failed (``role``: claim, heartbeat, write…)."""

    def idle(self) -> float | None:
        """The writer has nothing to write for now (writer thread): flush what waits.
        Seconds after which to be told again if the writer is still idle (None: no
        need)."""
        return None

    def close(self) -> None:
        """The worker stops (writer thread, after the last outcome)."""


class Signals(Observer):
    """The job signals of ``django_dbworker.signals``, sent only when someone listens."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id

    def claimed(self, lane: Lane, jobs: Sequence[Any], seconds: float) -> None:
        if signals.job_claimed.receivers:
            for job in jobs:
                signals.send(
                    signals.job_claimed,
                    lane.model,
                    job=job,
                    handler=lane.handler,
                    worker_id=self.worker_id,
                )

    def started(self, attempt: Attempt) -> None:
        if not signals.job_started.receivers:  # each attempt asks: no arguments built
            return
        lane = attempt.lane
        signals.send(
            signals.job_started, lane.model, job=attempt.job, handler=lane.handler, attempt=attempt
        )

    def finished(self, lane: Lane, written: Sequence[Written]) -> None:
        if signals.job_finished.receivers:
            for attempt, outcome, _ in written:
                signals.send(
                    signals.job_finished,
                    lane.model,
                    job=attempt.job,
                    handler=lane.handler,
                    attempt=attempt,
                    outcome=outcome,
                )

    def canceled(self, attempt: Attempt) -> None:
        lane = attempt.lane
        signals.send(
            signals.job_canceled,
            lane.model,
            job=attempt.job,
            handler=lane.handler,
            attempt=attempt,
        )


class Events:
    """Fans each event out to the observers."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = list(observers)
        #: Per method, the observers that override it: an event no one watches (most
        #: observers watch few) costs a dictionary lookup, not a call per observer.
        self._watching = {
            method: [
                observer
                for observer in self.observers
                if getattr(type(observer), method, None) is not getattr(Observer, method)
            ]
            for method in vars(Observer)
            if not method.startswith("_")
        }

    def _each(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` of each observer that overrides it; what they returned."""
        returned = []
        for observer in self._watching[method]:
            try:
                returned.append(getattr(observer, method)(*args))
            except Exception:
                logger.exception(
                    "observer %r failed on %s", observer, method, extra={"action": "observer"}
                )
        return returned

    def attach(self, lanes: Sequence[Lane]) -> None:
        self._each("attach", lanes)

    def claimed(self, lane: Lane, jobs: Sequence[Any], seconds: float) -> None:
        self._each("claimed", lane, jobs, seconds)

    def started(self, attempt: Attempt) -> None:
        self._each("started", attempt)

    def ended(self, attempt: Attempt) -> None:
        self._each("ended", attempt)

    def finished(self, lane: Lane, written: Sequence[Written]) -> None:
        if written:
            self._each("finished", lane, written)

    def canceled(self, attempt: Attempt) -> None:
        self._each("canceled", attempt)

    def statement_failed(self, role: str) -> None:
        self._each("statement_failed", role)

    def idle(self) -> float | None:
        """Seconds after which an observer asks to be told again (None: none asks)."""
        return min((wait for wait in self._each("idle") if wait is not None), default=None)

    def close(self) -> None:
        self._each("close")
