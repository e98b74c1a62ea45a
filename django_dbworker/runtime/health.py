"""How a worker process tells its operator that the database is out of reach.

Every thread of a worker that talks to the database (claims, heartbeats,
outcomes, the listener, the resetter) retries on its own with backoff. Were
each to log each failure, an outage would read as several mixed lines a second.
Instead they report here, and the operator reads one line when the outage
begins (with what the threads do meanwhile), a reminder every
``REMIND_EVERY`` seconds while it lasts, and one line when it ends.
"""

from __future__ import annotations

import logging
import threading
import time

from .logs import extra

logger = logging.getLogger("django_dbworker.worker")

#: Seconds between two "still unreachable" lines during one outage.
REMIND_EVERY = 30.0


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class DatabaseHealth:
    """Outages of the database as the threads of one worker process see them."""

    def __init__(self, worker_id: str = "") -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()
        #: When the current outage began (monotonic), or None while all is well.
        self.down_since: float | None = None
        self._reminded_at = 0.0
        self._failing: set[str] = set()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, role: str, exc: BaseException, retry_in: float | None = None) -> None:
        """A thread (``role``) lost the database; it retries on its own."""
        now = time.monotonic()
        with self._lock:
            self._failing.add(role)
            if self.down_since is None:
                self.down_since = self._reminded_at = now
                retry = f"; retrying in {retry_in:.1f}s with backoff" if retry_in else ""
                logger.warning(
                    "database unreachable (%s)%s. Running jobs go on; claims, heartbeats "
                    "and outcomes wait for it",
                    first_line(exc),
                    retry,
                    extra=extra("database_down", worker=self.worker_id),
                )
            elif now - self._reminded_at >= REMIND_EVERY:
                self._reminded_at = now
                logger.warning(
                    "database still unreachable after %.0fs (%s)",
                    now - self.down_since,
                    first_line(exc),
                    extra=extra("database_down", worker=self.worker_id),
                )

    def ok(self, role: str) -> None:
        """A thread (``role``) reached the database."""
        if self.down_since is None:
            return
        with self._lock:
            self._failing.discard(role)
            if self.down_since is None or self._failing:
                return
            down_for = time.monotonic() - self.down_since
            self.down_since = None
        logger.info(
            "database reachable again after %.1fs",
            down_for,
            extra=extra("database_up", worker=self.worker_id),
        )
