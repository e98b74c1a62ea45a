"""The heartbeat thread: keeps held jobs alive and notices cancel flags and lost rows."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..exceptions import CancelReason
from ..sql.connection import Connections
from .events import Events
from .health import DatabaseHealth
from .overtime import check_runtimes
from .registry import registries
from .silence import SilenceWatch

if TYPE_CHECKING:
    from .lane import Lane

logger = logging.getLogger("django_dbworker.heartbeat")


class Heartbeat(threading.Thread):
    """Every ``heartbeat_interval``, one statement per lane refreshes all held jobs.

    A job that does not come back was deleted or taken from us: its attempt is
    stopped and nothing is written for it. A job that comes back with
    ``cancel`` set has its attempt cancelled. When the statement itself fails
    (a database blip, a lock wait past the statement timeout) nothing is
    cancelled; the next beat tries again. But a lane whose heartbeats have not
    landed for most of its ``stalled_max_age`` (failing, or hanging in a
    statement that never comes back) has its attempts stopped by the silence
    watch (``runtime.silence``), a thread of its own: the resetter will soon
    hand their jobs to other workers, and a job must not run twice at once.
    """

    def __init__(
        self,
        lanes: Sequence[Lane],
        worker_id: str,
        health: DatabaseHealth,
        *,
        on_died: Callable[[], None],
        on_db_lost: Callable[[bool, str], None],
        events: Events | None = None,
        labels: dict[str, list[str]] | None = None,
        on_reached: Callable[[str], None] | None = None,
    ) -> None:
        """``on_died``: the thread ended on an unexpected error (the worker then stops);
        ``on_db_lost(contended, alias)``: a beat found the database ``alias`` out of reach,
        or (``contended``) SQLite's write lock held long (the worker's resetter then holds
        back). ``labels``: per database, the ``consumer:<name>`` labels its registry
        row lists. ``on_reached(alias)``: the registry row of ``alias`` was written again
        after a failure (the database is back: its claims need not wait out their
        backoff)."""
        super().__init__(name="dbworker-heartbeat", daemon=True)
        self.lanes = list(lanes)
        self.worker_id = worker_id
        self.health = health
        self.on_died = on_died
        self.on_db_lost = on_db_lost
        self.events = events or Events([])
        self.on_reached = on_reached or (lambda alias: None)
        #: The databases whose registry write failed last.
        self._unreached: set[str] = set()
        #: This worker's registry row in each database it claims from.
        self.registries = registries(worker_id, self.lanes, labels or {})
        self.tick = min([lane.heartbeat_interval for lane in self.lanes] + [1.0])
        self._stop_event = threading.Event()
        self.conn = Connections("heartbeat")
        self._next: dict[Lane, float] = {}
        #: Stops the attempts of lanes whose heartbeats stopped landing.
        self.silence = SilenceWatch(self.lanes, worker_id, self.tick, self._stop_event)
        #: Set once the first registration was tried (whether it worked or not).
        self.registered = threading.Event()
        #: The thread ended on an unexpected error (the worker then stops).
        self.died = False

    def start(self) -> None:
        self.silence.start()
        super().start()

    def stop(self) -> None:
        self._stop_event.set()

    def join(self, timeout: float | None = None) -> None:
        """The heartbeat thread and its silence watch (which ends at once when told)."""
        super().join(timeout)
        self.silence.join(timeout)

    def run(self) -> None:
        clean = False
        try:
            while True:
                self.beat_once()
                if self._stop_event.wait(self.tick):
                    break
            clean = True
        finally:
            if not clean:
                self.died = True
                self.on_died()
            for registry in self.registries:
                try:
                    if registry.registered:
                        registry.unregister(self.conn(registry.alias))
                except Exception as exc:
                    logger.warning("could not remove this worker from the registry: %s", exc)
            self.conn.close()

    def beat_once(self) -> None:
        now = time.monotonic()
        health = self.health
        for lane in self.lanes:
            try:
                check_runtimes(lane, now)
            except Exception:
                logger.exception("%s: checking maximum runtimes failed", lane.label)
            if now >= self._next.get(lane, 0.0):
                self._next[lane] = now + lane.heartbeat_interval
                conn = self.conn(lane.alias)
                began = time.monotonic()
                try:
                    self.beat(lane)
                    self.silence.landed(lane, began)
                    health.ok("heartbeat", lane.alias)
                except Exception as exc:
                    self.events.statement_failed("heartbeat")
                    self.silence.failed(lane, conn.lost)
                    if conn.lost:
                        health.failed("heartbeat", exc, alias=lane.alias)
                    else:
                        logger.warning("%s: heartbeat failed, retrying: %s", lane.label, exc)
                    if conn.lost or conn.contended:
                        self.on_db_lost(not conn.lost, lane.alias)
                else:
                    if conn.contended:
                        self.on_db_lost(True, lane.alias)
        for registry in self.registries:  # each database on its own: one may be down
            conn = self.conn(registry.alias)
            try:
                if registry.registered:
                    registry.beat(conn)
                else:
                    registry.register(conn)
                    registry.registered = True
            except Exception as exc:
                if conn.lost:
                    self._unreached.add(registry.alias)
                else:
                    logger.warning("worker registry update failed: %s", exc)
            else:
                if registry.alias in self._unreached:
                    self._unreached.discard(registry.alias)
                    self.on_reached(registry.alias)
        self.registered.set()

    def beat(self, lane: Lane) -> None:
        with lane.lock:
            held = dict(lane.held)
        if not held:
            return
        stmts = lane.stmts
        conn = self.conn(lane.alias)
        params = {"ids": stmts.ids_param(list(held)), "worker": self.worker_id}
        # Check-ins ride along with the heartbeat of their row.
        progress = {pk: p for pk, a in held.items() if (p := a.take_progress()) is not None}
        try:
            if progress:
                params.update(stmts.progress_params(progress))
                rows = conn.execute(stmts.heartbeat_with_progress, params)
            else:
                rows = conn.execute(stmts.heartbeat, params)
        except BaseException:
            for pk in progress:
                held[pk].progress_unwritten()
            raise
        alive = dict(zip(stmts.keys(rows), (bool(row[1]) for row in rows), strict=True))
        for pk, entry in progress.items():
            if pk in alive:
                held[pk].progress_written(entry)
            else:  # skipped (locked) or no longer ours
                held[pk].progress_unwritten()
        missing = [pk for pk in held if pk not in alive]
        if missing and stmts.dialect.row_locks:
            # Rows another transaction holds a lock on were skipped, not lost: the
            # resetter cannot take them either while the lock lasts.
            skipped = conn.execute(
                stmts.still_held, {"ids": stmts.ids_param(missing), "worker": self.worker_id}
            )
            alive.update(zip(stmts.keys(skipped), (bool(r[1]) for r in skipped), strict=True))
            if skipped:
                logger.debug("%s: heartbeat skipped locked jobs %s", lane.label, skipped)
        for pk, attempt in held.items():
            if pk not in alive:
                attempt.request_cancel(CancelReason.LOST)
            elif alive[pk]:
                if attempt.cancel_reason is None and not attempt.finished:
                    self.events.canceled(attempt)
                attempt.request_cancel(CancelReason.CANCELED)
            if attempt.cancel_reason is not None:
                attempt.reinterrupt(lane.heartbeat_interval)  # swallowed JobCanceled: again
