"""The scheduler: enqueues the due ticks of periodic schedules, once each across every
worker process and host.

Any worker that runs a handler (or task queue) with schedules enqueues its due ticks;
there is no leader. Each tick is one transaction: the tick's record (unique per
schedule and tick, so a second enqueuer of the same tick fails there and rolls back),
the job, and the schedule's row moved on from the tick it expected (a worker that read
it before another moved it rolls back too). A worker killed inside that transaction
leaves nothing, and another enqueues the tick.

Times are the database's: a pass judges what is due by the database's clock, so a
worker whose own clock runs ahead (or behind) neither enqueues ticks early nor moves
the shared next tick past ticks it then never enqueues.

During a rolling deploy old and new workers may declare a schedule differently (its
expression, time zone or handler): the declaration of the worker process that started
last wins, and one that started earlier leaves the schedule alone instead of setting
it back at each pass (which would postpone its ticks for as long as both run).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import F

from ..control.models import Schedule, ScheduleTick
from ..control.periodic import WAIT, Periodic
from ..control.unique import holder_of, is_key_violation
from ..databases import handler_alias, per_alias
from ..handler import Handler
from ..runtime.logs import extra
from ..sql.dialects import dialect_for

logger = logging.getLogger("django_dbworker.scheduler")

#: Longest sleep between two passes: how soon a schedule switched on is seen.
MAX_DELAY = 5.0
#: Records of enqueued ticks are kept this long (a worker never looks further back).
TICK_RETENTION = datetime.timedelta(days=1)
#: Seconds between two deletions of old tick records.
TICK_PRUNE_INTERVAL = 600.0


class _Lost(Exception):
    """Another worker enqueued the tick, or moved the schedule on first."""


class _Held(Exception):
    """The tick's job waits for a unique key another job holds (``if_held="wait"``)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    handler: Handler
    periodic: Periodic

    @property
    def name(self) -> str:
        return self.periodic.name


class Scheduler:
    """The schedules of ``handlers``: each in the database of its handler's jobs (its
    row, its ticks' records and the job of each tick commit together there), passed
    over per database by a ``DatabaseScheduler``; one database out of reach leaves the
    others' schedules ticking."""

    def __init__(self, handlers: Sequence[Handler]) -> None:
        entries: dict[str, Entry] = {}
        for handler in handlers:
            for periodic in handler.periodic_schedules():
                first = entries.setdefault(periodic.name, Entry(handler, periodic))
                if first.handler is not handler:  # dbworker.E009 refuses it at start
                    logger.error(
                        "schedule %s: declared by %s and by %s; only the first runs",
                        periodic.name,
                        first.handler.get_name(),
                        handler.get_name(),
                        extra=extra("schedule_failed", schedule=periodic.name),
                    )
        grouped = per_alias(entries.values(), lambda entry: handler_alias(entry.handler))
        self.parts = [DatabaseScheduler(part, alias) for alias, part in grouped.items()]

    def __bool__(self) -> bool:
        return bool(self.parts)

    def run_once(self) -> float:
        """Enqueue what is due in each database; seconds until the next tick (at most
        ``MAX_DELAY``)."""
        return min((part.run_once() for part in self.parts), default=MAX_DELAY)

    def _pass(self, now: datetime.datetime, read_at: float | None = None) -> float:
        return min((part._pass(now, read_at) for part in self.parts), default=MAX_DELAY)


class DatabaseScheduler:
    """The schedules whose jobs live in the database ``alias``."""

    def __init__(self, entries: Sequence[Entry], alias: str) -> None:
        self.entries = list(entries)
        self.alias = alias
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._next_prune = 0.0
        #: When this process started, by the database's clock (its first pass).
        self.started: datetime.datetime | None = None
        #: Schedules this process leaves to a later-started one, and the held ticks it
        #: waits on (each logged once).
        self._standing_aside: set[str] = set()
        self._waiting: set[tuple[str, datetime.datetime]] = set()

    def __bool__(self) -> bool:
        return bool(self.entries)

    def run_once(self) -> float:
        """Enqueue what is due; seconds until the next tick (at most ``MAX_DELAY``)."""
        try:
            return self._pass(self.database_now(), time.monotonic())
        except DatabaseError as exc:
            logger.error(
                "schedules: pass failed, trying again in %.0fs: %s",
                MAX_DELAY,
                exc,
                extra=extra("schedule_failed"),
            )
            return MAX_DELAY

    def database_now(self) -> datetime.datetime:
        """The database's clock (SQLite's is this machine's: the file is on it)."""
        connection = connections[self.alias]
        return dialect_for(connection).clock(connection)

    def _pass(self, now: datetime.datetime, read_at: float | None = None) -> float:
        """One pass at ``now``: the database's clock, read at ``read_at`` (monotonic;
        default: just now). The delay it returns counts from that read."""
        read_at = time.monotonic() if read_at is None else read_at
        if self.started is None:
            self.started = now
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + TICK_PRUNE_INTERVAL
            ScheduleTick.objects.using(self.alias).filter(tick__lt=now - TICK_RETENTION).delete()
        rows = {
            row.name: row
            for row in Schedule.objects.using(self.alias).filter(
                name__in=[e.name for e in self.entries]
            )
        }
        delay = MAX_DELAY
        for entry in self.entries:
            followed = self._follow_code(
                entry, rows.get(entry.name) or self._register(entry, now), now
            )
            if followed is None or not followed.enabled:
                continue
            expected = followed.next_tick
            if expected is None:  # _follow_code() never leaves it so
                continue
            ticks = entry.periodic.due(expected, now)
            if not ticks and expected <= now:  # missed ticks, skipped: move on
                self._move_on(entry, expected, now)
            for tick in ticks:
                try:
                    expected = self._enqueue(entry, tick, expected)
                except (_Lost, _Held):
                    break
                except Exception as exc:  # the handler's enqueue_scheduled() failed
                    logger.error(
                        "schedule %s: cannot enqueue the tick of %s (tried again): %s: %s",
                        entry.name,
                        tick.isoformat(),
                        type(exc).__name__,
                        exc,
                        extra=extra("schedule_failed", schedule=entry.name),
                    )
                    break
            # The first tick after the pass's own clock: one that fell due while the pass
            # ran is not enqueued yet, and the next pass must come at once, not at the
            # tick after it (a one-second schedule would run a second late).
            upcoming = entry.periodic.next_after(now)
            delay = min(delay, (upcoming - now).total_seconds())
        return max(delay - (time.monotonic() - read_at), 0.0)

    def _register(self, entry: Entry, now: datetime.datetime) -> Schedule:
        row, _ = Schedule.objects.using(self.alias).get_or_create(
            name=entry.name,
            defaults={
                **self._declared(entry),
                "next_tick": entry.periodic.next_after(now),
                "declared_at": self.started,
            },
        )
        return row

    def _follow_code(self, entry: Entry, row: Schedule, now: datetime.datetime) -> Schedule | None:
        """A schedule whose expression, time zone or handler changed in the code (or
        whose next tick was emptied by hand) starts afresh from its next tick, unless a
        worker process that started after this one declared it (None: leave it)."""
        declared = self._declared(entry)
        same = all(getattr(row, k) == v for k, v in declared.items())
        if same and row.next_tick:
            self._standing_aside.discard(entry.name)
            return row
        assert self.started is not None
        if not same and row.declared_at is not None and row.declared_at > self.started:
            if entry.name not in self._standing_aside:
                self._standing_aside.add(entry.name)
                logger.info(
                    "schedule %s: a worker started later declares it as %r (%s, %s); this "
                    "one (%r) leaves it alone",
                    entry.name,
                    row.expression,
                    row.timezone,
                    row.target,
                    entry.periodic.cron,
                    extra=extra("schedule_declared", schedule=entry.name),
                )
            return None
        self._standing_aside.discard(entry.name)
        next_tick = entry.periodic.next_after(now)
        Schedule.objects.using(self.alias).filter(pk=row.pk, next_tick=row.next_tick).update(
            **declared, next_tick=next_tick, declared_at=self.started
        )
        row.refresh_from_db()
        return row

    def _move_on(self, entry: Entry, expected: datetime.datetime, now: datetime.datetime) -> None:
        cutoff = now - datetime.timedelta(seconds=entry.periodic.missed_after)
        Schedule.objects.using(self.alias).filter(name=entry.name, next_tick=expected).update(
            next_tick=entry.periodic.next_after(cutoff)
        )

    @staticmethod
    def _declared(entry: Entry) -> dict[str, Any]:
        return {
            "expression": entry.periodic.cron,
            "timezone": entry.periodic.timezone,
            "target": entry.handler.get_name(),
        }

    def _enqueue(
        self, entry: Entry, tick: datetime.datetime, expected: datetime.datetime
    ) -> datetime.datetime:
        """Enqueue ``tick`` if no one did; the schedule's next tick after it. A job
        whose unique key is held skips the tick (``_Held`` with ``if_held="wait"``)."""
        next_tick = entry.periodic.next_after(tick)
        schedules = Schedule.objects.using(self.alias).filter(name=entry.name, next_tick=expected)
        with transaction.atomic(using=self.alias):
            try:
                with transaction.atomic(using=self.alias):
                    record = ScheduleTick.objects.using(self.alias).create(
                        schedule=entry.name, tick=tick, worker=self.worker
                    )
            except IntegrityError:
                raise _Lost from None
            try:
                with transaction.atomic(using=self.alias):
                    job = entry.handler.enqueue_scheduled(entry.periodic)
            except IntegrityError as exc:
                model = entry.handler.model
                if model is None or not is_key_violation(exc, model):
                    raise
                holder = self._held(entry, tick)
                moved = schedules.update(
                    next_tick=next_tick,
                    skipped_ticks=F("skipped_ticks") + 1,
                    last_skipped_tick=tick,
                )
                if not moved:
                    raise _Lost from None
                label = ""
            else:
                label = f"{job._meta.label}:{job.pk}"
                moved = schedules.update(next_tick=next_tick, last_tick=tick, last_job=label)
                if not moved:
                    raise _Lost
                ScheduleTick.objects.using(self.alias).filter(pk=record.pk).update(job=label)
        if not label:
            logger.info(
                "schedule %s: skipped the tick of %s, its job's unique key is held by %s "
                "(a run still going)",
                entry.name,
                tick.isoformat(),
                holder,
                extra=extra("schedule_skipped", schedule=entry.name, tick=tick.isoformat()),
            )
            return next_tick
        self._waiting.discard((entry.name, tick))
        logger.info(
            "schedule %s: enqueued %s for %s",
            entry.name,
            label,
            tick.isoformat(),
            extra=extra("scheduled", schedule=entry.name, job=str(job.pk), tick=tick.isoformat()),
        )
        return next_tick

    def _held(self, entry: Entry, tick: datetime.datetime) -> str:
        """The job that holds the key the job of ``tick`` needs, as a label. With
        ``if_held="wait"``: raise ``_Held`` (the tick's transaction rolls back, and a
        later pass tries it again), logged once per tick."""
        model = entry.handler.model
        assert model is not None
        holder = holder_of(model(**entry.periodic.fields), self.alias)
        label = f"{model._meta.label}:{holder.pk}" if holder is not None else "a job"
        if entry.periodic.if_held == WAIT:
            if (entry.name, tick) not in self._waiting:
                self._waiting.add((entry.name, tick))
                logger.info(
                    "schedule %s: the tick of %s waits for %s, which holds its job's unique key",
                    entry.name,
                    tick.isoformat(),
                    label,
                    extra=extra("schedule_waiting", schedule=entry.name, tick=tick.isoformat()),
                )
            raise _Held
        return label
