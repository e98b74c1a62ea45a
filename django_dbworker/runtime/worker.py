"""The worker: wires lanes, executors, heartbeat, writer and listener of one process,
runs the dispatcher, and shuts down in two stages."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Protocol

from django.db import connections, models

from .. import conf
from ..exceptions import CancelReason
from ..handler import Handler, seconds
from ..signals import send, worker_started, worker_stopped, worker_stopping
from ..sql.notify import enabled
from .attempt import Attempt
from .dispatcher import Dispatcher, Maintenance
from .done import DoneNotifier
from .drain import give_back_waiting
from .events import Events, Observer, Signals
from .executor import ThreadExecutor
from .health import DatabaseHealth
from .heartbeat import Heartbeat
from .lane import Lane, LaneCallbacks
from .listener import Listener
from .logs import extra
from .pool import Pool
from .registry import registry_alias
from .signals import SignalHandlers, StopRequests, take_early_signals
from .stager import Stager
from .stats import Stats
from .writer import Writer

logger = logging.getLogger("django_dbworker.worker")

#: After the grace period (or a second signal) handlers are cancelled and get
#: this long to return before the process leaves them to the resetter.
FORCE_WAIT = 5.0
#: When the heartbeat or the outcome writer thread dies, handlers get at most this
#: share of stalled_max_age to return: the process must be gone before the resetter
#: may hand their jobs to another worker.
ABANDON_SHARE = 1 / 3

#: Builds the maintenance a worker runs (its resetter) from what it must spare: the
#: ids the worker holds itself.
MaintenanceFactory = Callable[[Callable[[type[models.Model]], list[Any]]], Maintenance]


class Companion(Protocol):
    """What runs beside the lanes in its own threads (the consumers' runner)."""

    @property
    def labels(self) -> list[str]:
        """Listed in the worker's registry row after the handlers."""

    def start(self, worker_id: str, fatal: Callable[[str], None]) -> None:
        """Start; ``fatal(reason)`` when it cannot go on in this process."""

    def stop(self) -> None: ...
    def join(self, timeout: float) -> None: ...


def companion_labels(companions: Sequence[Companion]) -> dict[str, list[str]]:
    """Per database, the labels of the companions whose state lives there (the
    consumers' checkpoints): the registry row of that database lists them."""
    labels: dict[str, list[str]] = {}
    for companion in companions:
        alias = getattr(companion, "alias", None) or registry_alias()
        labels.setdefault(alias, []).extend(companion.labels)
    return labels


def plural(count: int, noun: str) -> str:
    """``1 job``, ``2 jobs``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


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
    ``processing`` for the resetter. ``maintenance`` builds what runs beside the
    claims on ``DBWORKER["RESET_INTERVAL"]`` (``runworker`` passes the resetter).
    ``burst``: stop once nothing is left to claim; ``until_done``: once none of the
    handlers' jobs is left unfinished (retries due later included).
    """

    def __init__(
        self,
        handlers: Sequence[Handler],
        *,
        burst: bool = False,
        until_done: bool = False,
        max_jobs: int | None = None,
        max_time: float | None = None,
        shutdown_timeout: float = 30.0,
        maintenance: MaintenanceFactory | None = None,
        install_signal_handlers: bool = True,
        worker_id: str | None = None,
        observers: Sequence[Observer] = (),
        companions: Sequence[Companion] = (),
        pool: int | None = None,
    ) -> None:
        if not handlers and not companions:
            raise ValueError("a worker needs at least one handler")
        self.companions = list(companions)
        self.worker_id = worker_id or make_worker_id()
        # Told what happens: the lifecycle signals, the dashboard's statistics, and
        # whatever else watches (``observers``: metrics).
        watching: list[Observer] = [Signals(self.worker_id)]
        if conf.get("STATS_RETENTION") is not None:
            watching.append(Stats(self.worker_id))
        # Told of retries' delays by the writer: wakes the dispatcher when they come due.
        self.stager = Stager(lambda: self.dispatcher.wake())
        watching.append(self.stager)
        # Wakes the processes that wait for jobs to end (``job.wait()``; PostgreSQL).
        watching.append(DoneNotifier())
        self.events = Events([*watching, *observers])
        self.shutdown_timeout = shutdown_timeout
        self.install_signal_handlers = install_signal_handlers
        self.health = DatabaseHealth(self.worker_id)
        self.exit_code = 0
        self.stop_level = 0  # 0 running, 1 draining, 2 forced
        self._stop_requests = StopRequests()  # a signal's copies do not force
        self.abandoning = False  # a bookkeeping thread died: stop without grace
        self.maintenance = maintenance(self.held_ids) if maintenance is not None else None
        self.writer = Writer(
            self.worker_id,
            self.health,
            on_died=self.wake,
            on_gave_up=self._failed_exit,
            events=self.events,
        )
        callbacks = LaneCallbacks(
            submit=self.writer.submit,
            slot_free=lambda lane: self.dispatcher.on_slot_free(lane),
            released=lambda lane: self.dispatcher.on_released(lane),
            held_ids=self.held_ids,
            holds_reset_job=self.holds_reset_job,
            writing=self.writer.is_alive,
            claimed=self.events.claimed,
            started=self.events.started,
            ended=self.events.ended,
        )
        # ``pool``: every handler on one pool of that many slots (threads, for the
        # handlers whose ``handle`` is not ``async def``), handed out by weight.
        self.pool = Pool(pool) if pool else None
        shared = None
        if self.pool is not None:
            shared = ThreadExecutor("pool", self.pool.size, _run_attempt)
        self.lanes = [
            Lane(
                handler,
                self.worker_id,
                callbacks,
                # async def handlers run as coroutines on their lane's event loop.
                executor=None
                if shared is None or inspect.iscoroutinefunction(handler.handle)
                else lambda run: shared,
                pool=self.pool,
            )
            for handler in handlers
        ]
        self.writer.several_databases = len({lane.alias for lane in self.lanes}) > 1
        if self.pool is not None:
            self.pool.attach(self.lanes)
            # Claimed ahead of free slots: as much as the handler that allows most.
            self.pool.prefetch = max((lane.prefetch for lane in self.lanes), default=0)
        self.dispatcher = Dispatcher(
            self.lanes,
            self.worker_id,
            self.health,
            burst=burst,
            until_done=until_done,
            max_jobs=max_jobs,
            max_time=max_time,
            maintenance=self.maintenance,
            events=self.events,
            pool=self.pool,
            stager=self.stager,
        )
        self.heartbeat = Heartbeat(
            self.lanes,
            self.worker_id,
            self.health,
            on_died=self.wake,
            on_db_lost=self.maintenance.note_failure if self.maintenance else lambda *_: None,
            events=self.events,
            labels=companion_labels(self.companions),
            on_reached=self.dispatcher.database_back,
        )
        self._signals = SignalHandlers()
        tables: dict[str, set[str]] = {}
        for lane in self.lanes:
            if enabled(lane.alias):
                tables.setdefault(lane.alias, set()).add(lane.table)
        self.listeners = [
            Listener(
                alias,
                names,
                self.dispatcher.on_notify,
                functools.partial(self.dispatcher.poll_fast, names),
            )
            for alias, names in tables.items()
        ]

    # -- control ---------------------------------------------------------------------

    def stop(self, force: bool = False) -> None:
        self.stop_level = 2 if force else min(self.stop_level + 1, 2)
        self.dispatcher.wake_event.set()

    def wake(self) -> None:
        self.dispatcher.wake()

    def _failed_exit(self) -> None:
        self.exit_code = 1

    def _companion_failed(self, reason: str) -> None:
        """A companion cannot go on in this process (a consumer's batch hung for good):
        drain, then exit with code 1 (a supervisor starts the process again)."""
        self.exit_code = 1
        if self.stop_level == 0:
            self.stop()

    @property
    def processed(self) -> int:
        return self.dispatcher.processed

    def holds_reset_job(self) -> bool:
        """Whether this process holds a job that was reset (see Lane.claim)."""
        return any(lane.holds_reset_job() for lane in self.lanes)

    def held_ids(self, model: Any) -> list[Any]:
        """Ids of ``model`` any lane of this process holds."""
        return [pk for lane in self.lanes if lane.model is model for pk in list(lane.held)]

    # -- lifecycle -------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped; the exit code. ``WorkerStartError`` if the handler threads
        cannot be started (nothing was claimed then)."""
        self.events.attach(self.lanes)
        for lane in self.lanes:
            lane.executor.start()
        if self.install_signal_handlers:
            self._signals.install(self._on_signal, (signal.SIGTERM, signal.SIGINT))
            for signum in take_early_signals()[:1]:  # sent while it started: claim nothing
                self._on_signal(signum, None)
        try:
            logger.info(
                "worker %s started: %s",
                self.worker_id,
                ", ".join(f"{lane.label} x{lane.num_handlers}" for lane in self.lanes),
                extra=extra("worker_started", worker=self.worker_id),
            )
            self.heartbeat.start()
            self.writer.start()
            for listener in self.listeners:
                listener.start()
            # The registry row (with the stalled_max_age of our jobs, which resetters
            # read) is in before the first claim, unless the database is out of reach.
            self.heartbeat.registered.wait(5.0)
            for companion in self.companions:
                companion.start(self.worker_id, self._companion_failed)
            send(
                worker_started,
                Worker,
                worker_id=self.worker_id,
                handlers=[lane.label for lane in self.lanes],
            )
            self.dispatcher.run(self._stopping)
            send(
                worker_stopping,
                Worker,
                worker_id=self.worker_id,
                running=sum(len(lane.running()) for lane in self.lanes),
            )
            self._drain()
        finally:
            self._finish()
            self._signals.restore()
        written = self.writer.counts
        summary = ", ".join(f"{n} {state}" for state, n in sorted(written.items()))
        logger.info(
            "worker %s stopped after %s%s (exit code %d)",
            self.worker_id,
            plural(sum(written.values()), "attempt"),
            f": {summary}" if summary else "",
            self.exit_code,
            extra=extra("worker_stopped", worker=self.worker_id),
        )
        send(
            worker_stopped,
            Worker,
            worker_id=self.worker_id,
            exit_code=self.exit_code,
            outcomes=dict(written),
        )
        return self.exit_code

    def _stopping(self) -> bool:
        dead = self._dead_thread()
        if dead:
            self._abandon(dead)
        return self.stop_level > 0

    def _drain(self) -> None:
        give_back_waiting(self.lanes)
        running = sum(len(lane.running()) for lane in self.lanes)
        deadline = time.monotonic() + self.shutdown_timeout
        if running and self.stop_level < 2:
            logger.info(
                "worker %s stopping: waiting up to %gs for %s "
                "(send the signal again to stop them now)",
                self.worker_id,
                self.shutdown_timeout,
                plural(running, "running job"),
            )
        while self._busy() and self.stop_level < 2 and time.monotonic() < deadline:
            self.dispatcher.wake_event.clear()
            dead = self._dead_thread()
            if dead:
                self._abandon(dead)
                break
            self.dispatcher.wake_event.wait(min(0.5, max(deadline - time.monotonic(), 0.0)))
        if self._busy():
            attempts = [a for lane in self.lanes for a in lane.running()]
            logger.warning(
                "worker %s: stopping %s: %s",
                self.worker_id,
                plural(len(attempts), "running job"),
                ", ".join(a.label for a in attempts),
            )
            give_back_waiting(self.lanes, all_waiting=True)
            for attempt in attempts:
                attempt.request_cancel(CancelReason.SHUTDOWN)
            force_wait = FORCE_WAIT
            if self.abandoning:
                stalled = min(seconds(lane.handler.stalled_max_age) or 0.0 for lane in self.lanes)
                force_wait = min(FORCE_WAIT, stalled * ABANDON_SHARE)
            force_deadline = time.monotonic() + force_wait
            while self._busy() and time.monotonic() < force_deadline:
                self.dispatcher.wake_event.clear()
                self.dispatcher.wake_event.wait(0.1)

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
            extra=extra("abandon", worker=self.worker_id),
        )
        self.exit_code = 1
        self.abandoning = True
        for lane in self.lanes:
            for attempt in lane.running():
                attempt.request_cancel(CancelReason.LOST)
        self.stop_level = 2

    def _busy(self) -> bool:
        """Whether attempts (or post_handle calls) are to be waited for: not those
        written off past their maximum runtime (their outcomes are written)."""
        return any(lane.busy > lane.abandoned or lane.posting for lane in self.lanes)

    def _finish(self) -> None:
        for companion in self.companions:
            companion.stop()
        for companion in self.companions:
            companion.join(self.shutdown_timeout + FORCE_WAIT)
        for lane in self.lanes:
            lane.executor.stop()
        abandoned = [a for lane in self.lanes for a in lane.running()]
        if abandoned:
            self.exit_code = 1
            logger.error(
                "worker %s: handlers of jobs %s did not stop; leaving them to the resetter",
                self.worker_id,
                ", ".join(a.label for a in abandoned),
            )
        left = sum(lane.abandoned for lane in self.lanes)
        if left:
            logger.warning(
                "worker %s: %s written off past their maximum runtime still run; the "
                "process ends without them (their jobs' outcomes are written)",
                self.worker_id,
                plural(left, "handler"),
            )
        if self.writer.is_alive():
            self.writer.stop(deadline=time.monotonic() + max(self.shutdown_timeout, 5.0))
            self.writer.join()
        if self.heartbeat.is_alive():
            self.heartbeat.stop()
            self.heartbeat.join(timeout=10)
        for lane in self.lanes:
            lane.executor.join(timeout=1.0 if not abandoned else 0.0)
        for listener in self.listeners:
            listener.stop()
        for listener in self.listeners:
            listener.join(timeout=2.0)
        self.dispatcher.close()
        connections.close_all()

    # -- signals ---------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        copy = self._stop_requests.is_copy(signum, f"worker {self.worker_id}")
        if copy and self.stop_level == 1:  # draining already: a copy changes nothing
            return
        if self.stop_level == 0:
            logger.info("worker %s: %s received, draining", self.worker_id, name)
        else:
            logger.warning("worker %s: %s received again, stopping jobs now", self.worker_id, name)
        self.stop()


def _run_attempt(attempt: Attempt) -> None:
    """What a shared pool's thread runs: the attempt, through its own lane."""
    attempt.lane.execution.run(attempt)
