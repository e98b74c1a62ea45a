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
    """Outages of the databases as the threads of one worker process see them: each
    database (``alias``; None where the caller does not say) has outages of its own,
    told apart in the log lines when job tables live on several."""

    def __init__(self, worker_id: str = "") -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()
        #: Per database, when its current outage began (monotonic).
        self._down_since: dict[str | None, float] = {}
        self._reminded_at: dict[str | None, float] = {}
        self._failing: dict[str | None, set[str]] = {}

    @property
    def down_since(self) -> float | None:
        """When the oldest current outage began (monotonic), or None while all is well."""
        return min(self._down_since.values(), default=None)

    @property
    def down(self) -> bool:
        return bool(self._down_since)

    @staticmethod
    def _name(alias: str | None) -> str:
        return "database" if alias in (None, "default") else f"database {alias!r}"

    def failed(
        self, role: str, exc: BaseException, retry_in: float | None = None, alias: str | None = None
    ) -> None:
        """A thread (``role``) lost the database ``alias``; it retries on its own."""
        now = time.monotonic()
        name = self._name(alias)
        with self._lock:
            self._failing.setdefault(alias, set()).add(role)
            since = self._down_since.get(alias)
            if since is None:
                self._down_since[alias] = self._reminded_at[alias] = now
                retry = f"; retrying in {retry_in:.1f}s with backoff" if retry_in else ""
                logger.warning(
                    "%s unreachable (%s)%s. Running jobs go on; claims, heartbeats "
                    "and outcomes wait for it",
                    name,
                    first_line(exc),
                    retry,
                    extra=extra("database_down", worker=self.worker_id),
                )
            elif now - self._reminded_at[alias] >= REMIND_EVERY:
                self._reminded_at[alias] = now
                logger.warning(
                    "%s still unreachable after %.0fs (%s)",
                    name,
                    now - since,
                    first_line(exc),
                    extra=extra("database_down", worker=self.worker_id),
                )

    def ok(self, role: str, alias: str | None = None) -> None:
        """A thread (``role``) reached the database ``alias``."""
        if alias not in self._down_since:
            return
        with self._lock:
            failing = self._failing.get(alias, set())
            failing.discard(role)
            since = self._down_since.get(alias)
            if since is None or failing:
                return
            del self._down_since[alias]
            down_for = time.monotonic() - since
        logger.info(
            "%s reachable again after %.1fs",
            self._name(alias),
            down_for,
            extra=extra("database_up", worker=self.worker_id),
        )
