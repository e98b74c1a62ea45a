"""The worker: claims jobs for its lanes, runs them in handler threads, shuts down in two stages."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from django.db import connections

from . import conf
from .backoff import Backoff
from .db import Connection
from .exceptions import CancelReason
from .handler import Handler, seconds
from .heartbeat import Heartbeat
from .lane import Lane
from .notify import Listener, enabled
from .resetter import Resetter
from .writer import Writer

logger = logging.getLogger(__name__)

#: After the grace period (or a second signal) handlers are cancelled and get
#: this long to return before the process leaves them to the resetter.
FORCE_WAIT = 5.0
#: When the heartbeat or the outcome writer thread dies, handlers get at most this
#: share of stalled_max_age to return: the process must be gone before the resetter
#: may hand their jobs to another worker.
ABANDON_SHARE = 1 / 3


def make_worker_id() -> str:
    """Unique per process and start: host, pid and a random part (pods reuse names)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs the given handlers until stopped.

    ``run()`` blocks and returns an exit code. ``stop()`` (or SIGTERM/SIGINT when
    ``install_signal_handlers``) drains: no new claims, running jobs finish within
    ``shutdown_timeout`` while heartbeats go on, outcomes are written. A second
    ``stop()`` or the end of the grace period cancels the handlers; jobs whose
    handler returns are requeued, jobs whose handler does not return stay
    ``processing`` for the resetter.
    """

    def __init__(
        self,
        handlers: Sequence[Handler],
        *,
        burst: bool = False,
        max_jobs: int | None = None,
        max_time: float | None = None,
        shutdown_timeout: float = 30.0,
        with_resetter: bool = True,
        install_signal_handlers: bool = True,
        worker_id: str | None = None,
    ) -> None:
        if not handlers:
            raise ValueError("a worker needs at least one handler")
        self.worker_id = worker_id or make_worker_id()
        self.lanes = [Lane(handler, self) for handler in handlers]
        self.burst = burst
        self.max_jobs = max_jobs
        self.max_time = max_time
        self.shutdown_timeout = shutdown_timeout
        self.install_signal_handlers = install_signal_handlers
        self.resetter = Resetter(handlers, spare=self._held_ids) if with_resetter else None
        self.writer = Writer(self)
        self.heartbeat = Heartbeat(self)
        self.exit_code = 0
        self.stop_level = 0  # 0 running, 1 draining, 2 forced
        self.abandoning = False  # a bookkeeping thread died: stop without grace
        self._wake = threading.Event()
        self._conns: dict[str, Connection] = {}
        self._previous_handlers: dict[int, Any] = {}
        tables: dict[str, set[str]] = {}
        for lane in self.lanes:
            if enabled(lane.alias):
                tables.setdefault(lane.alias, set()).add(lane.table)
        self.listeners = [Listener(alias, names, self.on_notify) for alias, names in tables.items()]

    # -- control ---------------------------------------------------------------------

    def stop(self, force: bool = False) -> None:
        self.stop_level = 2 if force else min(self.stop_level + 1, 2)
        self._wake.set()

    def wake(self) -> None:
        # Callers change state first and the dispatcher clears the event before it
        # looks at state, so an event still set needs no second set (and its lock).
        if not self._wake.is_set():
            self._wake.set()

    def on_notify(self, table: str) -> None:
        """Jobs became claimable in ``table``: claim for its lanes now (listener thread)."""
        for lane in self.lanes:
            if lane.table == table:
                lane.notifications += 1
                lane.idle_interval = lane.interval
                lane.next_claim_at = 0.0
        self._wake.set()

    def on_released(self, lane: Lane) -> None:
        """An outcome of ``lane`` was written (writer thread). Wake the dispatcher only
        when that changes what it does: a burst lane waiting for a release to claim
        again, or a lane holding nothing any more (--burst, --max-jobs)."""
        lane.releases += 1
        if self.burst and lane.next_claim_at == float("inf"):
            lane.next_claim_at = 0.0
            self._wake.set()
        elif not lane.held:
            self._wake.set()

    @property
    def processed(self) -> int:
        return sum(lane.claimed for lane in self.lanes)

    def running_reset_job(self) -> bool:
        """Whether a handler of this process runs a job that was reset (see Lane.claim)."""
        return any(a.job.num_resets > 0 for lane in self.lanes for a in lane.running())

    def _held_ids(self, model: Any) -> list[Any]:
        return [pk for lane in self.lanes if lane.model is model for pk in list(lane.held)]

    def _conn(self, alias: str) -> Connection:
        if alias not in self._conns:
            self._conns[alias] = Connection(alias, "dispatcher")
        return self._conns[alias]

    # -- lifecycle -------------------------------------------------------------------

    def run(self) -> int:
        self._install_signals()
        try:
            logger.info(
                "worker %s started: %s",
                self.worker_id,
                ", ".join(f"{lane.label} x{lane.num_handlers}" for lane in self.lanes),
                extra={"worker": self.worker_id},
            )
            self.heartbeat.start()
            self.writer.start()
            for listener in self.listeners:
                listener.start()
            for lane in self.lanes:
                lane.start()
            self._dispatch()
            self._drain()
        finally:
            self._finish()
            self._restore_signals()
        logger.info(
            "worker %s stopped after %d jobs (exit code %d)",
            self.worker_id,
            self.processed,
            self.exit_code,
            extra={"worker": self.worker_id},
        )
        return self.exit_code

    def _dispatch(self) -> None:
        backoff = Backoff()
        started = time.monotonic()
        reset_interval = float(conf.get("RESET_INTERVAL"))
        next_reset = started
        while self.stop_level == 0:
            self._wake.clear()
            now = time.monotonic()
            dead = self._dead_thread()
            if dead:
                self._abandon(dead)
                break
            if self.max_time is not None and now - started >= self.max_time:
                logger.info("worker %s: --max-time reached", self.worker_id)
                break
            remaining = None if self.max_jobs is None else self.max_jobs - self.processed
            if remaining is not None and remaining <= 0 and not self._holding():
                break
            timeout = 60.0
            try:
                for lane in self.lanes:
                    timeout = min(timeout, self._claim(lane, now, remaining))
                if self.resetter is not None and now >= next_reset:
                    next_reset = now + reset_interval
                    self.resetter.run_once()
                backoff.reset()
            except Exception as exc:
                delay = backoff.next()
                logger.error(
                    "database error, claims paused for %.1fs: %s",
                    delay,
                    exc,
                    extra={"worker": self.worker_id},
                )
                lost = any(conn.lost for conn in self._conns.values())
                for conn in self._conns.values():
                    conn.close()
                if self.resetter is not None:
                    self.resetter.close()
                    if lost:
                        self.resetter.note_failure()
                for lane in self.lanes:
                    lane.next_claim_at = now + delay
                timeout = delay
            if self.burst and all(lane.drained for lane in self.lanes) and not self._holding():
                break
            if self.resetter is not None:
                timeout = min(timeout, max(next_reset - now, 0.0))
            self._wake.wait(max(timeout, 0.0))

    def _claim(self, lane: Lane, now: float, remaining: int | None) -> float:
        """Claim for one lane if it has free slots and is due; return how long to sleep."""
        free = lane.free_slots()
        if remaining is not None:
            free = min(free, remaining)
        if free <= 0:
            return 60.0
        if now < lane.next_claim_at:
            return lane.next_claim_at - now
        had_held = bool(lane.held)
        releases, notifications = lane.releases, lane.notifications
        got = lane.claim(self._conn(lane.alias), free)
        lane.drained = got == 0 and not had_held
        if got >= free:
            lane.next_claim_at = now
            lane.idle_interval = lane.interval
            return 60.0  # full: woken when a slot frees
        if self.burst:
            # Claim again when an outcome is written (a retry may be due at once);
            # re-check after the assignment so a release during the claim is not lost.
            lane.next_claim_at = float("inf")
            if lane.releases != releases:
                lane.next_claim_at = 0.0
                return 0.0
            return 60.0
        # Adaptive polling: back off while claims come back empty, from interval to
        # max_interval; work found (or a notification) brings it back to interval.
        delay = lane.interval if got else lane.idle_interval
        lane.idle_interval = lane.interval if got else min(delay * 2, lane.max_interval)
        lane.next_claim_at = now + delay
        if lane.notifications != notifications:  # arrived during the claim: not lost
            lane.next_claim_at = 0.0
            return 0.0
        return delay

    def _drain(self) -> None:
        for lane in self.lanes:
            lane.give_back_waiting()
        running = sum(len(lane.running()) for lane in self.lanes)
        deadline = time.monotonic() + self.shutdown_timeout
        if running and self.stop_level < 2:
            logger.info(
                "worker %s stopping: waiting up to %gs for %d running jobs "
                "(send the signal again to stop them now)",
                self.worker_id,
                self.shutdown_timeout,
                running,
            )
        while self._busy() and self.stop_level < 2 and time.monotonic() < deadline:
            self._wake.clear()
            dead = self._dead_thread()
            if dead:
                self._abandon(dead)
                break
            self._wake.wait(min(0.5, max(deadline - time.monotonic(), 0.0)))
        if self._busy():
            attempts = [a for lane in self.lanes for a in lane.running()]
            logger.warning(
                "worker %s: stopping %d running jobs: %s",
                self.worker_id,
                len(attempts),
                ", ".join(a.lane.job_label(a.pk) for a in attempts),
            )
            for attempt in attempts:
                attempt.request_cancel(CancelReason.SHUTDOWN)
            force_wait = FORCE_WAIT
            if self.abandoning:
                stalled = min(seconds(lane.handler.stalled_max_age) or 0.0 for lane in self.lanes)
                force_wait = min(FORCE_WAIT, stalled * ABANDON_SHARE)
            force_deadline = time.monotonic() + force_wait
            while self._busy() and time.monotonic() < force_deadline:
                self._wake.clear()
                self._wake.wait(0.1)

    def _dead_thread(self) -> str | None:
        """Which bookkeeping thread died, if one did."""
        if self.heartbeat.died or not self.heartbeat.is_alive():
            return "heartbeat"
        if self.writer.died or not self.writer.is_alive():
            return "outcome writer"
        return None

    def _abandon(self, thread: str) -> None:
        """Without its heartbeat the process cannot keep its jobs; without its writer it
        can never finish them. Stop now, before the resetter may hand them to another
        worker: running attempts are stopped as lost and the jobs left to the resetter."""
        logger.critical(
            "worker %s: the %s thread died; stopping now, its jobs are left to the resetter",
            self.worker_id,
            thread,
            extra={"worker": self.worker_id},
        )
        self.exit_code = 1
        self.abandoning = True
        for lane in self.lanes:
            for attempt in lane.running():
                attempt.request_cancel(CancelReason.LOST)
        self.stop_level = 2

    def _holding(self) -> bool:
        return any(lane.held for lane in self.lanes)

    def _busy(self) -> bool:
        return any(lane.busy for lane in self.lanes)

    def _finish(self) -> None:
        for lane in self.lanes:
            lane.stop_threads()
        abandoned = [a for lane in self.lanes for a in lane.running()]
        if abandoned:
            self.exit_code = 1
            logger.error(
                "worker %s: handlers of jobs %s did not stop; leaving them to the resetter",
                self.worker_id,
                ", ".join(a.lane.job_label(a.pk) for a in abandoned),
            )
        if self.writer.is_alive():
            self.writer.stop(deadline=time.monotonic() + max(self.shutdown_timeout, 5.0))
            self.writer.join()
        if self.heartbeat.is_alive():
            self.heartbeat.stop()
            self.heartbeat.join(timeout=10)
        for lane in self.lanes:
            lane.join_threads(timeout=1.0 if not abandoned else 0.0)
        for listener in self.listeners:
            listener.stop()
        for listener in self.listeners:
            listener.join(timeout=2.0)
        for conn in self._conns.values():
            conn.close()
        if self.resetter is not None:
            self.resetter.close()
        connections.close_all()

    # -- signals ---------------------------------------------------------------------

    def _install_signals(self) -> None:
        if not self.install_signal_handlers:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: signal handlers not installed")
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signals(self) -> None:
        for sig, previous in self._previous_handlers.items():
            signal.signal(sig, previous)
        self._previous_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stop_level == 0:
            logger.info("worker %s: %s received, draining", self.worker_id, name)
        else:
            logger.warning("worker %s: %s received again, stopping jobs now", self.worker_id, name)
        self.stop()
