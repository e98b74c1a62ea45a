"""The heartbeat thread: keeps held jobs alive and notices cancel flags and lost rows."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from .db import Connection
from .exceptions import CancelReason
from .registry import Registry

if TYPE_CHECKING:
    from .lane import Lane
    from .worker import Worker

logger = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Every ``heartbeat_interval``, one statement per lane refreshes all held jobs.

    A job that does not come back was deleted or taken from us: its attempt is
    stopped and nothing is written for it. A job that comes back with
    ``cancel`` set has its attempt cancelled. When the statement itself fails
    (a database blip, a lock wait past the statement timeout) nothing is
    cancelled; the next beat tries again.
    """

    def __init__(self, worker: Worker) -> None:
        super().__init__(name="dbworker-heartbeat", daemon=True)
        self.worker = worker
        self.registry = Registry(worker)
        self.tick = min([lane.heartbeat_interval for lane in worker.lanes] + [1.0])
        self._stop_event = threading.Event()
        self._conns: dict[str, Connection] = {}
        self._next: dict[Lane, float] = {}
        self._registered = False
        #: The thread ended on an unexpected error (the worker then stops).
        self.died = False

    def conn(self, alias: str) -> Connection:
        if alias not in self._conns:
            self._conns[alias] = Connection(alias, "heartbeat")
        return self._conns[alias]

    def stop(self) -> None:
        self._stop_event.set()

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
                self.worker.wake()
            try:
                if self._registered:
                    self.registry.unregister(self.conn(self.registry.alias))
            except Exception as exc:
                logger.warning("could not remove this worker from the registry: %s", exc)
            for conn in self._conns.values():
                conn.close()

    def beat_once(self) -> None:
        now = time.monotonic()
        for lane in self.worker.lanes:
            try:
                self._check_runtime(lane, now)
            except Exception:
                logger.exception("%s: checking maximum runtimes failed", lane.label)
            if now >= self._next.get(lane, 0.0):
                self._next[lane] = now + lane.heartbeat_interval
                try:
                    self.beat(lane)
                except Exception as exc:
                    logger.warning("%s: heartbeat failed, retrying: %s", lane.label, exc)
                    if self.worker.resetter is not None and self.conn(lane.alias).lost:
                        self.worker.resetter.note_failure()
        try:
            conn = self.conn(self.registry.alias)
            if self._registered:
                self.registry.beat(conn)
            else:
                self.registry.register(conn)
                self._registered = True
        except Exception as exc:
            logger.warning("worker registry update failed: %s", exc)

    def beat(self, lane: Lane) -> None:
        with lane.lock:
            held = dict(lane.held)
        if not held:
            return
        stmts, me = lane.stmts, self.worker.worker_id
        conn = self.conn(lane.alias)
        rows = conn.execute(stmts.heartbeat, [stmts.ids_param(list(held)), me])
        alive = {pk: bool(cancel) for pk, cancel in rows}
        missing = [pk for pk in held if pk not in alive]
        if missing and stmts.pg:
            # Rows another transaction holds a lock on were skipped, not lost: the
            # resetter cannot take them either while the lock lasts.
            skipped = conn.execute(stmts.still_held, [stmts.ids_param(missing), me])
            alive.update({pk: bool(cancel) for pk, cancel in skipped})
            if skipped:
                logger.debug("%s: heartbeat skipped locked jobs %s", lane.label, skipped)
        for pk, attempt in held.items():
            if pk not in alive:
                attempt.request_cancel(CancelReason.LOST)
            elif alive[pk]:
                attempt.request_cancel(CancelReason.CANCELED)

    def _check_runtime(self, lane: Lane, now: float) -> None:
        if lane.max_runtime is None:
            return
        for attempt in lane.running():
            if now - attempt.started > lane.max_runtime:
                attempt.request_cancel(CancelReason.TIMEOUT)
