"""Maintenance: passes over job tables that keep them healthy (the resetter of
stalled jobs, retention) and the scheduler of periodic jobs. Builds on ``sql`` and
``runtime``; a worker runs them through the narrow ``run_once()`` interface it is
given."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import conf
from ..handler import Handler
from .resetter import Resetter
from .retention import Retention
from .scheduler import MAX_DELAY, Scheduler


class Maintenance:
    """What a worker runs beside its claims, each on its own clock: the resetter every
    ``DBWORKER["RESET_INTERVAL"]``, retention every ``RETENTION_INTERVAL``, the
    scheduler when a tick is due."""

    def __init__(
        self, resetter: Resetter | None, retention: Retention | None, scheduler: Scheduler | None
    ) -> None:
        interval = conf.get("RETENTION_INTERVAL")
        self.passes: list[tuple[Callable[[], Any], float | None]] = []
        if resetter is not None:
            self.passes.append((resetter.run_once, float(conf.get("RESET_INTERVAL"))))
        if retention and interval:
            self.passes.append((retention.run_once, float(interval)))
        if scheduler:
            self.passes.append((scheduler.run_once, None))  # it says when it is due again
        self.due = [0.0] * len(self.passes)
        self.resetter, self.retention = resetter, retention

    def run_once(self) -> float:
        """Run the passes that are due; seconds until the next one is."""
        for i, (run, interval) in enumerate(self.passes):
            if time.monotonic() >= self.due[i]:
                # A pass that raises (the worker logs it) runs again after its interval.
                self.due[i] = time.monotonic() + (interval or MAX_DELAY)
                delay = run()
                self.due[i] = time.monotonic() + (delay if interval is None else interval)
        return max(min(self.due, default=60.0) - time.monotonic(), 0.0)

    def note_failure(self) -> None:
        if self.resetter is not None:
            self.resetter.note_failure()

    def close(self) -> None:
        if self.resetter is not None:
            self.resetter.close()
        if self.retention is not None:
            self.retention.close()


def maintenance_factory(
    handlers: Sequence[Handler], *, reset: bool = True
) -> Callable[[Callable[..., list[Any]]], Maintenance]:
    """What ``Worker(maintenance=…)`` takes: the resetter of ``handlers`` (sparing the
    jobs its worker holds; none with ``reset=False``), their retention and their
    periodic schedules."""

    def build(spare: Callable[..., list[Any]]) -> Maintenance:
        resetter = Resetter(handlers, spare=spare) if reset else None
        return Maintenance(resetter, Retention(handlers), Scheduler(handlers))

    return build
