"""The dispatcher: the worker's main loop. It claims for each lane when the lane has
free slots and is due, runs the maintenance it was given (resetter, retention, schedules)
when it is due, and sleeps until woken: by a free slot, a written outcome, a NOTIFY."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from .. import conf
from ..sql.connection import Connections
from ..sql.notify import wake_here
from ..sql.orm import orm_used, recycle_connections
from .backoff import Backoff
from .events import Events
from .health import DatabaseHealth
from .lane import Lane
from .logs import extra
from .pool import Pool
from .probe import Probe
from .stager import Stager

logger = logging.getLogger("django_dbworker.worker")


class Maintenance(Protocol):
    """What the worker runs besides claims (the resetter...): it never imports them."""

    def run_once(self) -> float: ...  # seconds until it is due again
    def note_failure(self, contended: bool = False, alias: str | None = None) -> None: ...
    def close(self) -> None: ...


class Dispatcher:
    def __init__(
        self,
        lanes: Sequence[Lane],
        worker_id: str,
        health: DatabaseHealth,
        *,
        burst: bool,
        max_jobs: int | None,
        until_done: bool = False,
        max_time: float | None,
        maintenance: Maintenance | None,
        events: Events | None = None,
        pool: Pool | None = None,
        stager: Stager | None = None,
    ) -> None:
        self.lanes = list(lanes)
        #: ``runworker --pool``: the lanes share its slots, handed out by weight.
        self.pool = pool
        self.worker_id = worker_id
        self.health = health
        self.burst = burst
        self.until_done = until_done
        self.max_jobs = max_jobs
        self.max_time = max_time
        self.maintenance = maintenance
        self.events = events or Events([])
        self.wake_event = threading.Event()
        #: Claim statements that reached the database (whatever they returned).
        self.claims_made = 0
        self._conn = Connections("dispatcher")
        self.probe = Probe(self.lanes)
        aliases = list(dict.fromkeys(lane.alias for lane in self.lanes))
        #: The job tables' database; None when they live on several: then a claim that
        #: fails holds back the lanes of its database only (``_lane_failed``).
        self.alias = aliases[0] if len(aliases) == 1 else None
        self._backoffs: dict[str, Backoff] = {}
        #: Releases the jobs that wait for a time when they come due.
        self.stager = stager if stager is not None else Stager(self.wake)
        self.stager.attach(self.lanes)

    # -- wake-ups (from other threads) -----------------------------------------------

    def wake(self) -> None:
        # Callers change state first and the loop clears the event before it looks at
        # state, so an event still set needs no second set (and its lock).
        if not self.wake_event.is_set():
            self.wake_event.set()

    def on_notify(self, table: str) -> None:
        """Jobs became claimable in ``table``: claim for its lanes now (listener thread).
        A job enqueued for later may come due before those the stager knows of."""
        self.stager.news(table)
        self.on_staged(table)

    def on_staged(self, table: str) -> None:
        """Jobs of ``table`` became claimable: claim for its lanes now."""
        for lane in self.lanes:
            if lane.table == table:
                lane.notifications += 1
                lane.idle_interval = lane.interval
                lane.next_claim_at = 0.0
        self.wake_event.set()

    def poll_fast(self, tables: Iterable[str]) -> None:
        """Wake-ups do not arrive for ``tables`` (listener thread): their idle lanes poll
        at their base ``interval`` from now on instead of backing off."""
        for lane in self.lanes:
            if lane.table in tables:
                lane.max_interval = lane.interval
                lane.idle_interval = lane.interval
        self.wake()

    def on_released(self, lane: Lane) -> None:
        """An outcome of ``lane`` was written (writer thread). Wake only when that
        changes what the loop does: a burst lane waiting for a release to claim again,
        or a lane holding nothing any more (--burst, --max-jobs)."""
        lane.releases += 1
        if self.burst and lane.next_claim_at == float("inf"):
            lane.next_claim_at = 0.0
            self.wake_event.set()
        elif not lane.held:
            self.wake_event.set()

    def on_slot_free(self, lane: Lane) -> None:
        """A handler slot of ``lane`` is free (its post_handle done): claim again.
        Counted as a release, so a burst claim that raced it is not the last one. A lane
        whose limits held jobs back claims at once: the finished job gave a slot back."""
        lane.releases += 1
        if (self.burst and lane.next_claim_at == float("inf")) or lane.claimer.held_back:
            lane.next_claim_at = 0.0
        self.wake()

    # -- the loop --------------------------------------------------------------------

    @property
    def processed(self) -> int:
        return sum(lane.claimed for lane in self.lanes)

    def holding(self) -> bool:
        return any(lane.held or lane.busy > lane.abandoned or lane.posting for lane in self.lanes)

    def _finished(self) -> bool:
        """``--burst``: nothing is left to claim; ``--until-done``: nor to run later."""
        if not (self.burst or self.until_done):
            return False
        if not all(lane.drained for lane in self.lanes) or self.holding():
            return False
        try:
            if self.stager.settle(self._conn, self.on_staged):  # due rows it did not know of
                return False
            return self.burst or not any(lane.has_unfinished() for lane in self.lanes)
        except Exception:  # out of reach: the claims say so; ask again at the next pass
            return False

    def run(self, stopping: Callable[[], bool]) -> None:
        """Claim until ``stopping()``, --max-time, --max-jobs or (--burst) nothing left.
        The maintenance it runs (the resetter) shares its connections."""
        undo = wake_here(self.on_notify)  # jobs this process enqueues, without NOTIFY
        try:
            with self._conn.bind():
                self._run(stopping)
        finally:
            undo()

    def _run(self, stopping: Callable[[], bool]) -> None:
        backoff = Backoff()
        started = time.monotonic()
        next_maintenance = started
        maintenance = self.maintenance
        while not stopping():
            self.wake_event.clear()
            now = time.monotonic()
            if self.max_time is not None and now - started >= self.max_time:
                logger.info("worker %s: --max-time reached", self.worker_id)
                break
            remaining = None if self.max_jobs is None else self.max_jobs - self.processed
            if remaining is not None and remaining <= 0 and not self.holding():
                break
            timeout = 60.0
            try:
                claimed = self.claims_made
                if self.pool is None:
                    for lane in self.lanes:
                        timeout = min(timeout, self._claim(lane, now, remaining))
                else:
                    timeout = self._claim_pooled(self.pool, now, remaining)
                if self.probe:
                    timeout = min(timeout, self.probe.run(now, self._conn, self.on_notify))
                if self.stager:  # after the claims: what it stages is claimed next pass
                    # Of several databases, one that fails holds back its own tables only.
                    failed = None
                    if self.alias is None:
                        failed = functools.partial(self._database_failed, now=now)
                    timeout = min(timeout, self.stager.run(now, self._conn, self.on_staged, failed))
                if maintenance is not None and now >= next_maintenance:
                    next_maintenance = now + float(conf.get("RESET_INTERVAL"))  # if it raises
                    next_maintenance = time.monotonic() + maintenance.run_once()
                if self.claims_made != claimed and self.alias is not None:  # reached it
                    backoff.reset()
                    self.health.ok("dispatcher", self.alias)
            except Exception as exc:
                timeout = self._failed(exc, backoff.next(), now)
                # The maintenance shares the failed connections: it waits for the pause.
                next_maintenance = max(next_maintenance, now + timeout)
            finally:
                if orm_used():  # hooks used the ORM in this thread
                    recycle_connections()
            if self._finished():
                break
            if maintenance is not None:
                timeout = min(timeout, max(next_maintenance - now, 0.0))
            if self.max_time is not None:
                timeout = min(timeout, started + self.max_time - now)
            self.wake_event.wait(max(timeout, 0.0))

    def _failed(self, exc: Exception, delay: float, now: float) -> float:
        self.events.statement_failed("claim")
        lost = any(conn.lost for conn in self._conn)
        if lost:
            self.health.failed("dispatcher", exc, delay, self.alias)
        else:
            logger.error(
                "claims failed, paused for %.1fs: %s",
                delay,
                exc,
                extra=extra("claim_failed", worker=self.worker_id),
            )
        self.close()
        if lost and self.maintenance is not None:
            self.maintenance.note_failure()
        for lane in self.lanes:
            lane.next_claim_at = now + delay
        return delay

    def database_back(self, alias: str) -> None:
        """The database ``alias`` answers again (heartbeat thread): the lanes its outage
        held back claim at once rather than at the end of their backoff. Their first
        claim gives back what a claim cut by the outage took (``Lane.claim``), before the
        resetter, which waits ``stalled_max_age`` after a failure, would spend a reset."""
        if alias not in self._backoffs:
            return
        for lane in self.lanes:
            if lane.alias == alias:
                lane.next_claim_at = 0.0
        self.wake()

    def _lane_failed(self, lane: Lane, exc: Exception, now: float) -> float:
        """A claim of ``lane`` failed, its job tables one database of several: the
        lanes of that database wait (with a backoff of its own), the others claim on."""
        return self._database_failed(lane.alias, exc, now=now)

    def _database_failed(self, alias: str, exc: Exception, *, now: float) -> float:
        """A statement on ``alias``, one database of several, failed: ``_lane_failed``."""
        delay = self._backoffs.setdefault(alias, Backoff()).next()
        self.events.statement_failed("claim")
        conn = self._conn(alias)
        if conn.lost:
            self.health.failed("dispatcher", exc, delay, alias)
            if self.maintenance is not None:
                self.maintenance.note_failure(alias=alias)
        else:
            logger.error(
                "claims on database %r failed, paused for %.1fs: %s",
                alias,
                delay,
                exc,
                extra=extra("claim_failed", worker=self.worker_id),
            )
        conn.close()
        for other in self.lanes:
            if other.alias == alias:
                other.next_claim_at = now + delay
        return delay

    def _claim_pooled(self, pool: Pool, now: float, remaining: int | None) -> float:
        """Hand the pool's free slots to the due lanes by weight (``Pool.draw``), each
        claiming what it drew in one statement; the slots of a lane that came back short
        (nothing left, paused, held back by a limit) go to the others at once, and it is
        out of the draw until it is due again. How long to sleep."""
        timeout = 60.0
        short: set[Lane] = set()
        taken = self.processed
        for _ in range(len(self.lanes) + 1):  # a lane comes back short once per pass
            free = pool.free()
            if remaining is not None:
                free = min(free, remaining - (self.processed - taken))
            eligible = [
                lane
                for lane in self.lanes
                if lane not in short and now >= lane.next_claim_at and lane.free_slots() > 0
            ]
            if free <= 0 or not eligible:
                break
            for lane, want in pool.draw(eligible, free):
                before = lane.claimed
                timeout = min(timeout, self._claim(lane, now, want))
                got = lane.claimed - before
                pool.claimed(lane, got)
                if got < want:
                    short.add(lane)
                    pool.left(lane)
        waiting = [lane.next_claim_at - now for lane in self.lanes if lane.next_claim_at > now]
        return min([timeout, *waiting])

    def _claim(self, lane: Lane, now: float, remaining: int | None) -> float:
        """Claim for one lane (at most ``remaining`` jobs) if it has free slots and is
        due; return how long to sleep."""
        free = lane.free_slots()
        if remaining is not None:
            free = min(free, remaining)
        if free <= 0:
            return 60.0
        if now < lane.next_claim_at:
            return lane.next_claim_at - now
        # A thread still in post_handle (which runs once the outcome is written) may
        # change what pre_dequeue allows: the lane is not drained before it is done.
        had_held = bool(lane.held) or lane.busy > lane.abandoned or lane.posting > 0
        releases, notifications = lane.releases, lane.notifications
        try:
            got = lane.claim(self._conn(lane.alias), free)
        except Exception as exc:
            if self.alias is not None:
                raise
            return self._lane_failed(lane, exc, now)
        self.claims_made += 1
        if self.alias is None and self._backoffs.pop(lane.alias, None) is not None:
            self.health.ok("dispatcher", lane.alias)
        held_back = lane.claimer.held_back
        lane.drained = got == 0 and not had_held and not held_back
        if got >= free:
            lane.next_claim_at = now
            lane.idle_interval = lane.interval
            return 60.0  # full: woken when a slot frees
        if held_back:
            # A limit holds jobs back: claim again when a slot of ours frees, a NOTIFY
            # comes, a rate limit's next token is due, or (a slot another worker holds)
            # after a delay that grows like an idle lane's.
            soon = lane.claimer.poll_delay(lane.interval)
            delay = lane.idle_interval if soon is None else soon
            if soon is None:
                lane.idle_interval = min(delay * 2, lane.max_interval)
            lane.next_claim_at = now + delay
            return delay
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

    def close(self) -> None:
        self._conn.close()
        if self.maintenance is not None:
            self.maintenance.close()
