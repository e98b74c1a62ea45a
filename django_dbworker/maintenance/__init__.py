"""Maintenance: passes over job tables that keep them healthy (the resetter of
stalled jobs, retention) and the scheduler of periodic jobs. Builds on ``sql`` and
``runtime``; a worker runs them through the narrow ``run_once()`` interface it is
given."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import close_old_connections, connections

from .. import conf
from ..handler import Handler
from ..runtime.logs import extra
from .resetter import Resetter
from .retention import Retention
from .scheduler import MAX_DELAY, Scheduler

logger = logging.getLogger("django_dbworker.maintenance")

#: Seconds between two log lines of one pass failing the same way.
REPEAT_EVERY = 60.0


class Maintenance:
    """What a worker runs beside its claims, each on its own clock: the resetter every
    ``DBWORKER["RESET_INTERVAL"]`` and the scheduler when a tick is due (in the
    dispatcher's thread, which calls ``run_once``), and retention every
    ``RETENTION_INTERVAL`` in a thread of its own, so that pruning a large backlog
    never delays a claim."""

    def __init__(
        self, resetter: Resetter | None, retention: Retention | None, scheduler: Scheduler | None
    ) -> None:
        #: (name, run, interval; None: the pass says when it is due again).
        self.passes: list[tuple[str, Callable[[], Any], float | None]] = []
        if resetter is not None:
            self.passes.append(("resetter", resetter.run_once, float(conf.get("RESET_INTERVAL"))))
        if scheduler:
            self.passes.append(("scheduler", scheduler.run_once, None))
        self.due = [0.0] * len(self.passes)
        self.resetter = resetter
        interval = conf.get("RETENTION_INTERVAL")
        self.pruner = Pruner(retention, float(interval)) if retention and interval else None
        #: The last failure said of each pass, and when (a repeat is said once a minute).
        self._failures: dict[str, tuple[str, float]] = {}

    def run_once(self) -> float:
        """Run the passes that are due; seconds until the next one is. A pass that
        raises is logged under its own name and runs again after its interval: it
        never holds up the worker's claims."""
        if self.pruner is not None and not self.pruner.is_alive():
            self.pruner.start()
        for i, (name, run, interval) in enumerate(self.passes):
            if time.monotonic() >= self.due[i]:
                self.due[i] = time.monotonic() + (interval or MAX_DELAY)
                try:
                    delay = run()
                except Exception as exc:
                    self._failed(name, exc, interval or MAX_DELAY)
                    continue
                self._failures.pop(name, None)
                self.due[i] = time.monotonic() + (delay if interval is None else interval)
        return max(min(self.due, default=60.0) - time.monotonic(), 0.0)

    def _failed(self, name: str, exc: Exception, retry_in: float) -> None:
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        said = self._failures.get(name)
        if said is not None and said[0] == text and time.monotonic() - said[1] < REPEAT_EVERY:
            return
        self._failures[name] = (text, time.monotonic())
        logger.error(
            "%s pass failed, next in %gs: %s",
            name,
            retry_in,
            text,
            extra=extra(f"{name}_failed"),
        )

    def note_failure(self, contended: bool = False, alias: str | None = None) -> None:
        if self.resetter is not None:
            self.resetter.note_failure(contended, alias)

    def close(self) -> None:
        if self.resetter is not None:
            self.resetter.close()
        if self.pruner is not None:
            self.pruner.stop()


class Pruner(threading.Thread):
    """Runs retention every ``interval`` seconds until stopped; a failed pass is logged.
    Each pass opens its own connection and closes it at the end."""

    def __init__(self, retention: Retention, interval: float) -> None:
        super().__init__(name="dbworker-retention", daemon=True)
        self.retention = retention
        self.interval = interval
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self.retention.run_once(stopping=self._stopping)
                except Exception as exc:
                    logger.error(
                        "retention pass failed, next in %.0fs: %s",
                        self.interval,
                        exc,
                        extra=extra("retention_failed"),
                    )
                # Its own connection is not held between passes (a minute apart: a
                # pooler's or a server's slot for nothing); models deleted through
                # Django's collector use this thread's Django connection: between
                # passes, as between requests.
                self.retention.close()
                close_old_connections()
                self._stopping.wait(self.interval)
        finally:
            self.retention.close()
            connections.close_all()  # this thread's

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout)


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
