"""The worker's half of waiting for results: a NOTIFY when its writer ended jobs.

After each statement that left jobs of a table completed, failed or canceled, the
writer (this observer, in its thread, on its connection) sends
``pg_notify('dbworker_done', '<table><TAB><pk>=<state>;…')`` so that the waiters of other
processes (``django_dbworker.waiting``) wake at once instead of at their next poll,
without a query: one notification per table for what one statement ended (a group
commit's completions share it), and at most one round per ``COALESCE`` seconds for
what several statements ended meanwhile. Past PostgreSQL's 8,000 bytes, or with keys other than
integers and UUIDs, the payload is the table's name alone, and the hub reads. Only while
some process waits: every ``PROBE_EVERY`` seconds at most, and only when it has
something to tell, it looks for a waiting hub's session (``application_name``
``dbworker waiting``) in ``pg_stat_activity``. PostgreSQL only,
and not with ``DBWORKER["NOTIFY"] = False``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..sql.connection import Connections, Runner
from ..sql.notify import NOTIFY_SQL, enabled
from ..states import FINAL_STATES
from ..waiting import CHANNEL, SESSION_NAME
from ..waiting._link import payload
from .events import Observer, Written

if TYPE_CHECKING:
    from .lane import Lane

logger = logging.getLogger("django_dbworker.notify")

#: Seconds a worker trusts what it found about waiters.
PROBE_EVERY = 1.0
#: The shortest time between two rounds of NOTIFYs: what ends meanwhile waits for
#: the next round (so a busy writer sends at most one per table per 10 ms, and a
#: waiter of a job that ends alone is told at once).
COALESCE = 0.01
FINAL = frozenset(str(state) for state in FINAL_STATES)
WAITING = (
    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity "
    "WHERE application_name = %(name)s AND datname = current_database())"
)


class DoneNotifier(Observer):
    def __init__(self) -> None:
        self._conn = Connections("writer")
        #: Per database alias: (when it looked, whether a hub waits there).
        self._seen: dict[str, tuple[float, bool]] = {}
        #: Per (alias, table): the (pk, state) of ended jobs not told yet.
        self._pending: dict[tuple[str, str], list[tuple[Any, str]]] = {}
        self._told_at = 0.0

    def finished(self, lane: Lane, written: Sequence[Written]) -> None:
        ended = [(attempt.pk, state) for attempt, _, state in written if state in FINAL]
        if not ended or not enabled(lane.alias):
            return
        self._pending.setdefault((lane.alias, lane.table), []).extend(ended)
        if time.monotonic() - self._told_at >= COALESCE:
            self._tell()

    def idle(self) -> float | None:
        """The writer has nothing more for now: tell what waits, once ``COALESCE``
        passed since the last round (else: ask to be called again then)."""
        if not self._pending:
            return None
        wait = COALESCE - (time.monotonic() - self._told_at)
        if wait > 0:
            return wait
        self._tell()
        return None

    def _tell(self) -> None:
        """One NOTIFY per table of what ended since the last, where a hub waits."""
        pending, self._pending = self._pending, {}
        self._told_at = time.monotonic()
        for (alias, table), ended in pending.items():
            conn = Connections.of_thread(self._conn)(alias)
            try:
                if self._waited_on(conn, alias):
                    text = payload(table, ended)
                    conn.execute(NOTIFY_SQL, {"channel": CHANNEL, "table": text})
            except Exception as exc:  # the waiters poll: they are late, not lost
                logger.debug(
                    "the outcome NOTIFY failed: %s", exc, extra={"action": "notify_failed"}
                )

    def _waited_on(self, conn: Runner, alias: str) -> bool:
        now = time.monotonic()
        seen = self._seen.get(alias)
        if seen is not None and now - seen[0] < PROBE_EVERY:
            return seen[1]
        [(waiting,)] = conn.execute(WAITING, {"name": SESSION_NAME})
        self._seen[alias] = (now, bool(waiting))
        return bool(waiting)
