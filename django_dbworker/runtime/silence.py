"""The silence watch: stops the attempts of a lane whose heartbeats stopped landing,
whatever the heartbeat thread is doing meanwhile.

A heartbeat that fails is not the only way heartbeats stop: a statement can also hang,
neither coming back nor failing. Behind PgBouncer a new connection's first statement
waits in the pooler's queue for a server connection (session mode gives each client
one for as long as it stays connected, so after a restart the clients that reconnect
last may wait until others leave); a network partition drops packets without a reset.
Meanwhile a resetter that can reach the database hands the jobs to other workers once
their heartbeats are older than ``stalled_max_age``. So the watch runs in a thread of
its own that never touches the database: once a lane's last heartbeat that landed began
``NO_HEARTBEAT_SHARE`` of its ``stalled_max_age`` ago (or the attempt's claim, if
later), the lane's attempts are stopped (``NO_HEARTBEAT``, cooperative: requeued when
the database is back, if they are still ours), before the job may be reset.

On SQLite a heartbeat waiting for the write lock is no such sign (the resetter needs
the lock too, and holds back after waiting for it): there only a heartbeat that failed
because the database could not be reached starts the count, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..exceptions import CancelReason
from .logs import extra

if TYPE_CHECKING:
    from .lane import Lane

logger = logging.getLogger("django_dbworker.heartbeat")

#: A lane whose heartbeats have not landed for this share of its stalled_max_age stops
#: its jobs.
NO_HEARTBEAT_SHARE = 2 / 3


class SilenceWatch(threading.Thread):
    """Every ``tick``, stops the attempts of the lanes whose heartbeat is silent."""

    def __init__(
        self, lanes: Sequence[Lane], worker_id: str, tick: float, stop: threading.Event
    ) -> None:
        super().__init__(name="dbworker-silence", daemon=True)
        self.lanes = list(lanes)
        self.worker_id = worker_id
        self.tick = tick
        self._stop_event = stop
        now = time.monotonic()
        #: Per lane, when its last heartbeat that landed began (monotonic).
        self.beaten: dict[Lane, float] = dict.fromkeys(self.lanes, now)
        #: Lanes whose last heartbeat failed because the database could not be reached.
        self.lost: set[Lane] = set()
        #: Lanes silent now (said once until they beat again).
        self._said: set[Lane] = set()

    def landed(self, lane: Lane, began: float) -> None:
        """A heartbeat of ``lane`` that began at ``began`` landed (heartbeat thread)."""
        self.beaten[lane] = began
        self.lost.discard(lane)
        self._said.discard(lane)

    def failed(self, lane: Lane, lost: bool) -> None:
        """A heartbeat of ``lane`` failed; ``lost``: the database was out of reach."""
        if lost:
            self.lost.add(lane)

    def run(self) -> None:
        while not self._stop_event.wait(self.tick):
            try:
                self.check(time.monotonic())
            except Exception:  # never lose the watch to a bug: say it, go on
                logger.exception("checking for silent heartbeats failed")

    def check(self, now: float) -> None:
        for lane in self.lanes:
            if not lane.stmts.dialect.row_locks and lane not in self.lost:
                continue  # SQLite: waiting for the write lock (see the module's doc)
            last = self.beaten[lane]
            # Never before a beat was due (a stalled_max_age under three heartbeat
            # intervals is dbworker.W001).
            limit = max(lane.stalled_max_age * NO_HEARTBEAT_SHARE, 1.5 * lane.heartbeat_interval)
            attempts = [
                a
                for a in lane.running()
                if a.cancel_reason is None and now - max(last, a.claimed_at) >= limit
            ]
            if not attempts:
                continue
            if lane not in self._said:
                self._said.add(lane)
                logger.error(
                    "%s: no heartbeat for %.1fs (stalled_max_age %gs); stopping jobs %s",
                    lane.label,
                    now - last,
                    lane.stalled_max_age,
                    ", ".join(str(a.pk) for a in attempts),
                    extra=extra(
                        "no_heartbeat",
                        worker=self.worker_id,
                        jobs=[a.pk for a in attempts],
                        handler=lane.label,
                    ),
                )
            for attempt in attempts:
                attempt.request_cancel(CancelReason.NO_HEARTBEAT)
