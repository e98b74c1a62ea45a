"""The dashboard of a job model: what waits and runs per handler, and what finished.

Every figure is read with statements whose cost does not grow with the finished rows:

- per handler, one aggregate over the active rows (queued, errored, processing: the
  ``state`` index) and the oldest claimable job (the lowest id: the dequeue index);
- live workers and busy threads from the worker registry;
- throughput, failures and durations from ``JobStats`` (a row per worker, handler and
  minute): sums per minute over the last hour and per hour over the last day, and the
  duration histograms of the last hour merged into p50 and p95.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import router
from django.db.models import Count, Model, Q, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from ..control.limits import Limits, limits_usage
from ..handler import Handler
from ..states import DEQUEUEABLE_STATES, JobState
from ..stats import JobStats, merged, percentile
from ..text import human_duration
from .serving import Serving

#: What counts as a failed attempt on the charts.
FAILURES = ("errored", "failed", "lost")
#: The name of the row of a model no known handler serves.
ALL_JOBS = "(all jobs: no handler known)"


@dataclass
class HandlerRow:
    """One handler's line of the dashboard."""

    name: str
    queued: int = 0
    scheduled: int = 0
    processing: int = 0
    errored: int = 0
    oldest_age: float | None = None
    live_workers: int = 0
    silent_workers: int = 0
    busy: int = 0
    threads: int = 0
    paused: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)
    p50: float | None = None
    p95: float | None = None
    attempts_last_hour: int = 0
    #: In the shared pools of its live workers (``runworker --pool``): its weight, its
    #: share of their jobs over the last minutes, and their busy slots and size.
    pool: list[str] = field(default_factory=list)

    @property
    def oldest_age_text(self) -> str:
        return human_duration(self.oldest_age)

    @property
    def p50_text(self) -> str:
        return human_duration(self.p50)

    @property
    def p95_text(self) -> str:
        return human_duration(self.p95)


@dataclass
class Bucket:
    """The attempts that ended in one minute or hour."""

    start: datetime
    completed: int = 0
    failures: int = 0


@dataclass
class Dashboard:
    rows: list[HandlerRow]
    minutes: list[Bucket]
    hours: list[Bucket]
    now: datetime

    @property
    def minutes_total(self) -> Bucket:
        return _total(self.minutes)

    @property
    def hours_total(self) -> Bucket:
        return _total(self.hours)


def _total(buckets: list[Bucket]) -> Bucket:
    start = buckets[0].start if buckets else timezone.now()
    return Bucket(start, sum(b.completed for b in buckets), sum(b.failures for b in buckets))


def active_figures(model: type[Model], handler: Handler | None, now: datetime) -> dict[str, Any]:
    """Queued (claimable now), scheduled, processing, errored and the oldest claimable
    job's age of the jobs of ``model`` that ``handler`` takes (all, if None)."""
    rows = model._base_manager.using(router.db_for_read(model))
    if handler is not None and handler.dequeue_filter is not None:
        rows = rows.filter(handler.dequeue_filter)
    due = Q(process_after__isnull=True) | Q(process_after__lte=now)
    active = rows.filter(state__in=[*DEQUEUEABLE_STATES, JobState.PROCESSING])
    figures: dict[str, Any] = active.aggregate(
        queued=Count("pk", filter=Q(state=JobState.QUEUED) & due),
        scheduled=Count("pk", filter=Q(state=JobState.QUEUED, process_after__gt=now)),
        processing=Count("pk", filter=Q(state=JobState.PROCESSING)),
        errored=Count("pk", filter=Q(state=JobState.ERRORED)),
    )
    # Each state apart: on MariaDB a read of both went through the primary key from the
    # lowest, past every finished job (the state index gives each state in key order).
    firsts = [
        rows.filter(due, state=state).order_by("pk").values_list("pk", "queued_at", "process_after")
        for state in DEQUEUEABLE_STATES
    ]
    found = [first for first in (q.first() for q in firsts) if first is not None]
    oldest = min(found, key=lambda row: row[0])[1:] if found else None
    since = max((t for t in oldest if t is not None), default=None) if oldest else None
    figures["oldest_age"] = max((now - since).total_seconds(), 0.0) if since else None
    return figures


def dashboard(model: type[Model], serving: Serving, now: datetime | None = None) -> Dashboard:
    """The dashboard's figures of ``model``."""
    now = now or timezone.now()
    label = model._meta.label
    handlers: list[Handler | None] = list(serving.handlers) or [None]
    # Written beside the jobs, in their database (django_dbworker.databases).
    stats = JobStats.objects.using(router.db_for_read(model)).filter(model=label)
    hour_ago = now - timedelta(hours=1)
    histograms: dict[str, list[list[int]]] = {}
    for name, durations in stats.filter(minute__gte=hour_ago).values_list("handler", "durations"):
        histograms.setdefault(name, []).append(durations if isinstance(durations, list) else [])
    rows = []
    for handler in handlers:
        name = handler.get_name() if handler else ALL_JOBS
        row = HandlerRow(name, **active_figures(model, handler, now))
        if handler is not None:
            live = serving.live_workers(handler)
            row.live_workers = len(live)
            row.silent_workers = len(serving.silent_workers(handler))
            row.threads = sum(w.num_handlers for w in live)
            prefix = f"{label.lower()}:"
            row.busy = sum(
                1
                for w in live
                for job in (w.jobs if isinstance(w.jobs, list) else [])
                if str(job).lower().startswith(prefix)
            )
            row.pool = pooled(name, live)
            pause = serving.pause_of(handler)
            row.paused = [pause.name] if pause else []
            row.paused += [p.name for p in serving.paused_queues(handler)]
            if Limits.of(handler) is not None and (usage := limits_usage(handler)):
                row.limits = usage.lines()
            histogram = merged(histograms.get(name, []))
            row.attempts_last_hour = sum(histogram)
            row.p50, row.p95 = percentile(histogram, 0.5), percentile(histogram, 0.95)
        rows.append(row)
    return Dashboard(rows, minute_buckets(stats, now), hour_buckets(stats, now), now)


def pooled(name: str, workers: list[Any]) -> list[str]:
    """What the live ``workers`` that run handler ``name`` on a shared pool report of
    it: per worker, its weight and share, and the pool's busy slots."""
    lines = []
    for worker in workers:
        report = worker.pool
        handlers = report.get("handlers") if isinstance(report, dict) else None
        figures = handlers.get(name) if isinstance(handlers, dict) else None
        if not isinstance(figures, dict):
            continue
        share = figures.get("share")
        shown = f"{100 * share:.0f}%" if isinstance(share, int | float) else "?"
        size, busy = report.get("size"), report.get("busy")
        lines.append(f"weight {figures.get('weight')}, {shown} of a pool of {size} ({busy} busy)")
    return lines


def _sums() -> dict[str, Any]:
    return {"completed_n": Sum("completed"), **{f"{k}_n": Sum(k) for k in FAILURES}}


def _bucket(start: datetime, sums: dict[str, Any] | None) -> Bucket:
    if not sums:
        return Bucket(start)
    return Bucket(start, sums["completed_n"] or 0, sum(sums[f"{k}_n"] or 0 for k in FAILURES))


def minute_buckets(stats: Any, now: datetime) -> list[Bucket]:
    """Attempts per minute over the last hour, oldest first (the current minute last)."""
    this_minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    first = this_minute - timedelta(minutes=59)
    found = {
        row["minute"]: row
        for row in stats.filter(minute__gte=first).values("minute").annotate(**_sums())
    }
    return [
        _bucket(first + timedelta(minutes=i), found.get(first + timedelta(minutes=i)))
        for i in range(60)
    ]


def hour_buckets(stats: Any, now: datetime) -> list[Bucket]:
    """Attempts per hour over the last day, oldest first (the current hour last)."""
    this_hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    first = this_hour - timedelta(hours=23)
    rows = (
        stats.filter(minute__gte=first)
        .annotate(hour=TruncHour("minute", tzinfo=UTC))
        .values("hour")
        .annotate(**_sums())
    )
    found = {row["hour"]: row for row in rows}
    return [
        _bucket(first + timedelta(hours=i), found.get(first + timedelta(hours=i)))
        for i in range(24)
    ]
