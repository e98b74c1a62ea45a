"""``Periodic``: a cron schedule declared in code, and the ticks it has.

Cron expressions are read by cronsim (5 fields, or 6 with seconds first), in a named
time zone with the DST rules of cron: a time the clock skips runs once, at the first
valid time after the gap; a time the clock repeats runs once, at its first occurrence.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator, Mapping
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

#: What a schedule does with ticks it missed (no worker ran when they came due).
RUN_ONCE = "run_once"
SKIP = "skip"
#: What a schedule does with a tick whose job's unique key another job holds (a run
#: still going): skip the tick, or wait until the key is free and enqueue it then.
WAIT = "wait"
_UTC = datetime.UTC


@dataclasses.dataclass(frozen=True)
class Periodic:
    """Enqueue a job on a cron schedule, once per tick across all workers.

    On a ``Handler``: ``schedules = [Periodic("*/5 * * * *", fields={"kind": "sync"})]``
    creates a row of the handler's model with ``fields`` at every tick.

    ``missed``: a tick no worker enqueued within ``missed_after`` seconds of its time
    (every worker was down) is missed; after downtime ``"run_once"`` enqueues the
    latest missed tick once, ``"skip"`` enqueues none of them. Ticks that are late by
    less than ``missed_after`` are all enqueued.

    ``if_held``: when the job of a tick cannot be enqueued because another job holds
    its unique key (``unique_job_constraint``: the last run is still going),
    ``"skip"`` skips the tick (logged at INFO, counted on the schedule and in the
    metrics), ``"wait"`` enqueues it as soon as the key is free.
    """

    cron: str
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str = ""
    timezone: str = "UTC"
    missed: str = RUN_ONCE
    missed_after: float = 60.0
    if_held: str = SKIP

    def __post_init__(self) -> None:
        try:
            CronSim(self.cron, datetime.datetime.now(_UTC))
        except (CronSimError, ValueError) as exc:
            raise ValueError(f"cron expression {self.cron!r}: {exc}") from None
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {self.timezone!r}") from None
        if self.missed not in (RUN_ONCE, SKIP):
            raise ValueError(f"missed={self.missed!r}: use {RUN_ONCE!r} or {SKIP!r}")
        if self.if_held not in (SKIP, WAIT):
            raise ValueError(f"if_held={self.if_held!r}: use {SKIP!r} or {WAIT!r}")

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def named(self, default: str) -> Periodic:
        """This schedule, named ``default`` unless it has a name."""
        return self if self.name else dataclasses.replace(self, name=default)

    def next_after(self, moment: datetime.datetime) -> datetime.datetime:
        """The first tick after ``moment`` (in UTC)."""
        return next(self._ticks(moment)).astimezone(_UTC)

    def latest_at_or_before(self, moment: datetime.datetime) -> datetime.datetime:
        """The last tick at or before ``moment`` (in UTC)."""
        # Reverse iteration starts strictly before a whole second, at one with a fraction.
        if not moment.microsecond:
            moment += datetime.timedelta(microseconds=1)
        tick = next(CronSim(self.cron, moment.astimezone(self.zone), reverse=True))
        return tick.astimezone(_UTC)

    def due(self, first: datetime.datetime, now: datetime.datetime) -> list[datetime.datetime]:
        """The ticks to enqueue now, oldest first, when ``first`` is the earliest tick
        not handled yet: each tick of the last ``missed_after`` seconds, and before
        them the latest missed one if ``missed="run_once"``."""
        if first > now:
            return []
        cutoff = now - datetime.timedelta(seconds=self.missed_after)
        ticks: list[datetime.datetime] = []
        start = first
        if first < cutoff:
            missed = self.latest_at_or_before(cutoff)
            if missed >= first and self.missed == RUN_ONCE:
                ticks.append(missed)
            start = max(first, cutoff)
        tick = start if self._is_tick(start) else self.next_after(start)
        while tick <= now:
            if not ticks or tick > ticks[-1]:
                ticks.append(tick)
            tick = self.next_after(tick)
        return ticks

    def _is_tick(self, moment: datetime.datetime) -> bool:
        return moment.microsecond == 0 and self.latest_at_or_before(moment) == moment

    def _ticks(self, moment: datetime.datetime) -> Iterator[datetime.datetime]:
        return iter(CronSim(self.cron, moment.astimezone(self.zone)))
