"""The dashboard of a job model: what waits and runs per handler, and what finished.

Every figure is read with statements whose cost does not grow with the finished rows:

- per handler, one aggregate over the active rows (queued, errored, processing: the
  ``state`` index) and the oldest claimable job (the lowest id: the dequeue index);
- live workers and handler threads from the worker registry, busy threads from the
  jobs in flight it lists (looked up by primary key);
- throughput, failures and durations from ``JobStats`` (a row per worker, handler and
  minute): sums per minute over the last hour and per hour over the last day, and the
  duration histograms of the last hour merged into p50 and p95.

Each figure of jobs is of the rows the user may see (``scope.Visible``). ``JobStats``
count every job of the model, as do a shared pool's shares and busy slots: they are
shown only to a user who sees the whole table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import router
from django.db.models import Model, QuerySet, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from ..control.limits import Limits, limits_usage
from ..figures import active_figures
from ..handler import Handler
from ..states import DEQUEUEABLE_STATES, JobState
from ..stats import JobStats, merged, percentile
from ..text import human_duration
from .scope import Visible
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
    #: What the counts are, by figure: "≈ " an estimate, "≥ " a lower bound.
    marks: dict[str, str] = field(default_factory=dict)
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
    #: The per-minute statistics (charts, p50, p95) are shown: they count every job,
    #: so only to a user who sees the whole table.
    statistics: bool = True

    @property
    def minutes_total(self) -> Bucket:
        return _total(self.minutes)

    @property
    def hours_total(self) -> Bucket:
        return _total(self.hours)


def _total(buckets: list[Bucket]) -> Bucket:
    start = buckets[0].start if buckets else timezone.now()
    return Bucket(start, sum(b.completed for b in buckets), sum(b.failures for b in buckets))


def dashboard(
    model: type[Model],
    serving: Serving,
    visible: Visible | None = None,
    now: datetime | None = None,
) -> Dashboard:
    """The dashboard's figures of ``model``, of the jobs of ``visible`` (default: all)."""
    now = now or timezone.now()
    visible = visible or Visible.of(model._base_manager.using(router.db_for_read(model)))
    label = model._meta.label
    handlers: list[Handler | None] = list(serving.handlers) or [None]
    # Written beside the jobs, in their database (django_dbworker.databases).
    stats = JobStats.objects.using(router.db_for_read(model)).filter(model=label)
    if not visible.whole:
        stats = stats.none()
    hour_ago = now - timedelta(hours=1)
    histograms: dict[str, list[list[int]]] = {}
    for name, durations in stats.filter(minute__gte=hour_ago).values_list("handler", "durations"):
        histograms.setdefault(name, []).append(durations if isinstance(durations, list) else [])
    rows = []
    for handler in handlers:
        name = handler.get_name() if handler else ALL_JOBS
        row = HandlerRow(name, **active_figures(visible.rows, handler, now, visible.whole))
        if handler is not None:
            live = serving.live_workers(handler)
            row.live_workers = len(live)
            row.silent_workers = len(serving.silent_workers(handler))
            row.threads = sum(handler_threads(name, w) for w in live)
            row.busy = in_flight(visible.rows, handler, live)
            row.pool = pooled(name, live, shares=visible.whole)
            pause = serving.pause_of(handler)
            row.paused = [pause.name] if pause else []
            row.paused += paused_queues(serving, handler, visible)
            subset = None if visible.whole else visible.rows
            if Limits.of(handler) is not None and (usage := limits_usage(handler, subset)):
                row.limits = usage.lines()
            if visible.whole:
                histogram = merged(histograms.get(name, []))
                row.attempts_last_hour = sum(histogram)
                row.p50, row.p95 = percentile(histogram, 0.5), percentile(histogram, 0.95)
        rows.append(row)
    minutes, hours = minute_buckets(stats, now), hour_buckets(stats, now)
    return Dashboard(rows, minutes, hours, now, statistics=visible.whole)


def handler_threads(name: str, worker: Any) -> int:
    """The threads (in a shared pool: the slots it may take) ``worker`` runs handler
    ``name`` on: what it registered per handler; from a worker that registered none
    (an older release), its pool's ceiling for it, or its threads if it runs that
    handler only."""
    threads = worker.threads.get(name) if isinstance(worker.threads, dict) else None
    if isinstance(threads, int):
        return threads
    report = worker.pool if isinstance(worker.pool, dict) else {}
    figures = (
        report.get("handlers", {}).get(name) if isinstance(report.get("handlers"), dict) else None
    )
    if isinstance(figures, dict) and isinstance(figures.get("ceiling"), int):
        return int(figures["ceiling"])
    return int(worker.num_handlers or 0)


def in_flight(rows: QuerySet[Any], handler: Handler, workers: list[Any]) -> int:
    """The jobs of ``rows`` that ``handler`` takes and that ``workers`` hold now (the
    registry lists them by primary key)."""
    prefix = f"{rows.model._meta.label.lower()}:"
    pks = [
        str(job).split(":", 1)[1] if ":" in str(job) else ""
        for worker in workers
        for job in (worker.jobs if isinstance(worker.jobs, list) else [])
        if str(job).lower().startswith(prefix)
    ]
    if not pks:
        return 0
    try:
        held = rows.filter(pk__in=[pk for pk in pks if pk])
        if handler.dequeue_filter is not None:
            held = held.filter(handler.dequeue_filter)
        return held.count()
    except (ValueError, ValidationError):  # a label that is no primary key of the model
        return 0


def paused_queues(serving: Serving, handler: Handler, visible: Visible) -> list[str]:
    """The names of the paused queues of ``handler``; for a user who sees a subset of
    the jobs, only those of queues that hold active jobs of that subset."""
    pauses = serving.paused_queues(handler)
    if visible.whole or not pauses or not handler.queue_field:
        return [p.name for p in pauses]
    prefix = handler.queue_pause_prefix()
    by_queue = {p.name[len(prefix) :]: p.name for p in pauses}
    queues = (
        visible.rows.filter(state__in=[*DEQUEUEABLE_STATES, JobState.PROCESSING])
        .filter(**{f"{handler.queue_field}__in": list(by_queue)})
        .values_list(handler.queue_field, flat=True)
        .distinct()
    )
    seen = {str(queue) for queue in queues}
    return [name for queue, name in by_queue.items() if queue in seen]


def pooled(name: str, workers: list[Any], shares: bool = True) -> list[str]:
    """What the live ``workers`` that run handler ``name`` on a shared pool report of
    it: per worker, its weight and the pool's size, and (``shares``: to a user who
    sees every job) its share and the pool's busy slots."""
    lines = []
    for worker in workers:
        report = worker.pool
        handlers = report.get("handlers") if isinstance(report, dict) else None
        figures = handlers.get(name) if isinstance(handlers, dict) else None
        if not isinstance(figures, dict):
            continue
        size, busy = report.get("size"), report.get("busy")
        if not shares:
            lines.append(f"weight {figures.get('weight')} in a pool of {size}")
            continue
        share = figures.get("share")
        shown = f"{100 * share:.0f}%" if isinstance(share, int | float) else "?"
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
