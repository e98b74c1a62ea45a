"""The scheduler: enqueues the due ticks of periodic schedules, once each across every
worker process and host.

Any worker that runs a handler (or task queue) with schedules enqueues its due ticks;
there is no leader. Each tick is one transaction: the tick's record (unique per
schedule and tick, so a second enqueuer of the same tick fails there and rolls back),
the job, and the schedule's row moved on from the tick it expected (a worker that read
it before another moved it rolls back too). A worker killed inside that transaction
leaves nothing, and another enqueues the tick.
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

from django.db import DatabaseError, IntegrityError, router, transaction
from django.utils import timezone

from ..control.models import Schedule, ScheduleTick
from ..control.periodic import Periodic
from ..handler import Handler
from ..runtime.logs import extra

logger = logging.getLogger("django_dbworker.scheduler")

#: Longest sleep between two passes: how soon a schedule switched on is seen.
MAX_DELAY = 5.0
#: Records of enqueued ticks are kept this long (a worker never looks further back).
TICK_RETENTION = datetime.timedelta(days=1)
#: Seconds between two deletions of old tick records.
TICK_PRUNE_INTERVAL = 600.0


class _Lost(Exception):
    """Another worker enqueued the tick, or moved the schedule on first."""


@dataclasses.dataclass(frozen=True)
class Entry:
    handler: Handler
    periodic: Periodic

    @property
    def name(self) -> str:
        return self.periodic.name


class Scheduler:
    def __init__(self, handlers: Sequence[Handler]) -> None:
        self.entries = [
            Entry(handler, periodic)
            for handler in handlers
            for periodic in handler.periodic_schedules()
        ]
        self.alias = router.db_for_write(Schedule)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._next_prune = 0.0

    def __bool__(self) -> bool:
        return bool(self.entries)

    def run_once(self) -> float:
        """Enqueue what is due; seconds until the next tick (at most ``MAX_DELAY``)."""
        try:
            return self._pass(timezone.now())
        except DatabaseError as exc:
            logger.error(
                "schedules: pass failed, trying again in %.0fs: %s",
                MAX_DELAY,
                exc,
                extra=extra("schedule_failed"),
            )
            return MAX_DELAY

    def _pass(self, now: datetime.datetime) -> float:
        # First: the delay returned below counts from its own clock read, so nothing
        # slow may run between it and the return.
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
            row = rows.get(entry.name) or self._register(entry, now)
            row = self._follow_code(entry, row, now)
            if not row.enabled:
                continue
            expected = row.next_tick
            if expected is None:  # _follow_code() never leaves it so
                continue
            ticks = entry.periodic.due(expected, now)
            if not ticks and expected <= now:  # missed ticks, skipped: move on
                self._move_on(entry, expected, now)
            for tick in ticks:
                try:
                    expected = self._enqueue(entry, tick, expected)
                except _Lost:
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
            delay = min(delay, (upcoming - timezone.now()).total_seconds())
        return max(delay, 0.0)

    def _register(self, entry: Entry, now: datetime.datetime) -> Schedule:
        row, _ = Schedule.objects.using(self.alias).get_or_create(
            name=entry.name,
            defaults={**self._declared(entry), "next_tick": entry.periodic.next_after(now)},
        )
        return row

    def _follow_code(self, entry: Entry, row: Schedule, now: datetime.datetime) -> Schedule:
        """A schedule whose expression or time zone changed in the code (or whose next
        tick was emptied by hand) starts afresh."""
        declared = self._declared(entry)
        if row.next_tick and all(getattr(row, k) == v for k, v in declared.items()):
            return row
        next_tick = entry.periodic.next_after(now)
        Schedule.objects.using(self.alias).filter(pk=row.pk, next_tick=row.next_tick).update(
            **declared, next_tick=next_tick
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
        """Enqueue ``tick`` if no one did; the schedule's next tick after it."""
        next_tick = entry.periodic.next_after(tick)
        with transaction.atomic(using=self.alias):
            try:
                with transaction.atomic(using=self.alias):
                    record = ScheduleTick.objects.using(self.alias).create(
                        schedule=entry.name, tick=tick, worker=self.worker
                    )
            except IntegrityError:
                raise _Lost from None
            job = entry.handler.enqueue_scheduled(entry.periodic)
            label = f"{job._meta.label}:{job.pk}"
            moved = (
                Schedule.objects.using(self.alias)
                .filter(name=entry.name, next_tick=expected)
                .update(next_tick=next_tick, last_tick=tick, last_job=label)
            )
            if not moved:
                raise _Lost
            ScheduleTick.objects.using(self.alias).filter(pk=record.pk).update(job=label)
        logger.info(
            "schedule %s: enqueued %s for %s",
            entry.name,
            label,
            tick.isoformat(),
            extra=extra("scheduled", schedule=entry.name, job=str(job.pk), tick=tick.isoformat()),
        )
        return next_tick
