"""Prometheus metrics: ``pip install "django-dbworker[prometheus]"``.

``runworker --metrics-port 9100`` serves, at ``/metrics``:

- per handler, from the worker: ``dbworker_jobs_finished_total{handler,outcome}``,
  ``dbworker_attempt_duration_seconds{handler}`` (a histogram),
  ``dbworker_handler_threads{handler}`` and ``dbworker_handler_threads_busy{handler}``,
  ``dbworker_claims_total{handler}``, ``dbworker_jobs_claimed_total{handler}``,
  ``dbworker_claim_duration_seconds{handler}``, ``dbworker_resets_total{model}`` and
  ``dbworker_reset_failures_total{model}`` (the resetter inside the worker),
  ``dbworker_statement_errors_total{role}`` (the worker's own statements: claim,
  heartbeat, write);
- per job model, read from the database at each scrape:
  ``dbworker_jobs{model,state}`` (state: queued, scheduled, processing, errored) and
  ``dbworker_oldest_claimable_job_age_seconds{model}``;
- per periodic schedule, read at each scrape: ``dbworker_schedule_ticks_skipped_total``
  (ticks skipped because the job's unique key was held);
- per consumer, read at each scrape: ``dbworker_consumer_lag_rows``,
  ``dbworker_consumer_behind_seconds``, ``dbworker_consumer_failing`` and
  ``dbworker_consumer_paused`` (label ``consumer``).

With ``--processes N`` the supervisor serves the sum of its worker processes (through
prometheus_client's multiprocess mode: each process writes its figures to files in a
directory the supervisor makes and removes). ``metrics_view`` serves the per-model
gauges from Django itself (for setups with no worker port).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models, router
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import signals
from ..models import job_models as all_job_models
from ..runtime.events import Observer, Written
from ..states import JobState
from ..stats import DURATION_BUCKETS
from . import METRICS_CHILD

if TYPE_CHECKING:
    from ..handler import Handler
    from ..runtime.attempt import Attempt
    from ..runtime.lane import Lane

logger = logging.getLogger("django_dbworker.metrics")

#: Claim durations are short: their own buckets (seconds).
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class WorkerMetrics(Observer):
    """The per-handler figures of one worker process (an observer of its events)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        def metric(kind: Any, name: str, doc: str, labels: Sequence[str], **kw: Any) -> Any:
            return kind(name, doc, labels, registry=registry, **kw)

        self.finished_total = metric(
            Counter,
            "dbworker_jobs_finished",
            "Attempts whose outcome was written, by the "
            "state it wrote (lost: no longer this worker's).",
            ["handler", "outcome"],
        )
        self.duration = metric(
            Histogram,
            "dbworker_attempt_duration_seconds",
            "How long attempts ran.",
            ["handler"],
            buckets=DURATION_BUCKETS,
        )
        self.threads = metric(
            Gauge,
            "dbworker_handler_threads",
            "Handler threads.",
            ["handler"],
            multiprocess_mode="livesum",
        )
        self.busy = metric(
            Gauge,
            "dbworker_handler_threads_busy",
            "Handler threads running an attempt.",
            ["handler"],
            multiprocess_mode="livesum",
        )
        self.claims = metric(
            Counter, "dbworker_claims", "Claim statements that took jobs.", ["handler"]
        )
        self.jobs_claimed = metric(Counter, "dbworker_jobs_claimed", "Jobs claimed.", ["handler"])
        self.claim_duration = metric(
            Histogram,
            "dbworker_claim_duration_seconds",
            "How long claims took.",
            ["handler"],
            buckets=CLAIM_BUCKETS,
        )
        self.resets = metric(
            Counter, "dbworker_resets", "Stalled jobs the resetter queued again.", ["model"]
        )
        self.reset_failures = metric(
            Counter,
            "dbworker_reset_failures",
            "Stalled jobs the resetter failed (resets spent).",
            ["model"],
        )
        self.errors = metric(
            Counter,
            "dbworker_statement_errors",
            "Statements of the worker's own that failed (retried), by role.",
            ["role"],
        )
        signals.job_reset.connect(self._reset, dispatch_uid=f"dbworker-metrics-{id(self)}")

    def _reset(self, sender: type[models.Model], failed: bool, **kwargs: Any) -> None:
        (self.reset_failures if failed else self.resets).labels(sender._meta.label).inc()

    def attach(self, lanes: Sequence[Lane]) -> None:
        for lane in lanes:
            self.threads.labels(lane.label).set(lane.num_handlers)
            self.busy.labels(lane.label).set(0)

    def claimed(self, lane: Lane, jobs: Sequence[Any], seconds: float) -> None:
        self.claims.labels(lane.label).inc()
        self.jobs_claimed.labels(lane.label).inc(len(jobs))
        self.claim_duration.labels(lane.label).observe(seconds)

    def started(self, attempt: Attempt) -> None:
        self.busy.labels(attempt.lane.label).inc()

    def ended(self, attempt: Attempt) -> None:
        self.busy.labels(attempt.lane.label).dec()

    def finished(self, lane: Lane, written: Sequence[Written]) -> None:
        histogram = self.duration.labels(lane.label)
        counts: dict[str, int] = {}
        for _, outcome, state in written:
            key = "lost" if state is None else "requeued" if state == "queued" else state
            counts[key] = counts.get(key, 0) + 1
            histogram.observe(outcome.duration)
        for key, count in counts.items():
            self.finished_total.labels(lane.label, key).inc(count)

    def statement_failed(self, role: str) -> None:
        self.errors.labels(role).inc()

    def close(self) -> None:
        signals.job_reset.disconnect(dispatch_uid=f"dbworker-metrics-{id(self)}")


class TableGauges(Collector):
    """``dbworker_jobs{model,state}`` and ``dbworker_oldest_claimable_job_age_seconds``
    of ``job_models`` (default: every ``WorkerJob`` model), read at each scrape with
    statements the partial indexes answer (the oldest claimable job is the lowest id),
    and the consumer gauges (``CONSUMER_GAUGES``) of every checkpoint row."""

    def __init__(self, job_models: Callable[[], Iterable[type[models.Model]]] | None = None):
        self.job_models = job_models or all_job_models

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "dbworker_jobs",
            "Jobs per state: queued (claimable now), scheduled (queued for later), "
            "processing, errored (awaiting a retry).",
            labels=["model", "state"],
        )
        age = GaugeMetricFamily(
            "dbworker_oldest_claimable_job_age_seconds",
            "Seconds the oldest claimable job (the lowest id) has been waiting.",
            labels=["model"],
        )
        try:
            for model in self.job_models():
                label = model._meta.label
                try:
                    figures = table_figures(model)
                except Exception as exc:
                    logger.warning("metrics: cannot read %s: %s", label, exc)
                    continue
                for state in ("queued", "scheduled", "processing", "errored"):
                    jobs.add_metric([label, state], figures[state])
                age.add_metric([label], figures["oldest_age"])
            consumers = consumer_families()
            schedules = schedule_families()
        finally:
            # The scrape's own thread opened them: close them now.
            for conn in connections.all(initialized_only=True):
                conn.close()
        yield jobs
        yield age
        yield from consumers
        yield from schedules


#: The consumer gauges: name, help, and the figure of a checkpoint row at ``now``.
CONSUMER_GAUGES: list[tuple[str, str, Callable[[Any, Any], float]]] = [
    (
        "dbworker_consumer_lag_rows",
        "Rows between a consumer's checkpoint and the head it saw.",
        lambda row, now: row.lag,
    ),
    (
        "dbworker_consumer_behind_seconds",
        "Seconds a consumer has been behind that head (0: at the head).",
        lambda row, now: (row.behind_for(now) or timedelta(0)).total_seconds(),
    ),
    (
        "dbworker_consumer_failing",
        "1 while a consumer's batches fail max_failures times in a row or more.",
        lambda row, now: row.failing,
    ),
    ("dbworker_consumer_paused", "1 while a consumer is paused.", lambda row, now: row.paused),
]


def consumer_families() -> list[GaugeMetricFamily]:
    """The consumer gauges, one sample per checkpoint row (read at each scrape)."""
    from ..consumers.models import ConsumerCheckpoint

    families = [
        GaugeMetricFamily(name, text, labels=["consumer"]) for name, text, _ in CONSUMER_GAUGES
    ]
    try:
        rows = list(ConsumerCheckpoint.objects.using(router.db_for_read(ConsumerCheckpoint)))
    except Exception as exc:
        logger.warning("metrics: cannot read the consumers: %s", exc)
        return []
    now = timezone.now()
    for row in rows:
        for family, (_, _, figure) in zip(families, CONSUMER_GAUGES, strict=True):
            family.add_metric([row.name], float(figure(row, now)))
    return families


def schedule_families() -> list[CounterMetricFamily]:
    """``dbworker_schedule_ticks_skipped_total{schedule}``: ticks of each periodic
    schedule not enqueued because the job's unique key was held (read at each scrape)."""
    from ..control.models import Schedule

    family = CounterMetricFamily(
        "dbworker_schedule_ticks_skipped",
        "Ticks of a periodic schedule skipped because its job's unique key was held "
        "(a run still going).",
        labels=["schedule"],
    )
    try:
        rows = list(
            Schedule.objects.using(router.db_for_read(Schedule)).values_list(
                "name", "skipped_ticks"
            )
        )
    except Exception as exc:
        logger.warning("metrics: cannot read the schedules: %s", exc)
        return []
    for name, skipped in rows:
        family.add_metric([name], float(skipped))
    return [family]


def table_figures(model: type[models.Model]) -> dict[str, float]:
    """The per-state counts and the oldest claimable job's age of one job model."""
    now = timezone.now()
    rows = model._base_manager.using(router.db_for_read(model))
    due = models.Q(process_after__isnull=True) | models.Q(process_after__lte=now)
    queued = rows.filter(state=JobState.QUEUED)
    claimable = rows.filter(state__in=[JobState.QUEUED, JobState.ERRORED]).filter(due)
    oldest = claimable.order_by("pk").values_list("queued_at", "process_after").first()
    waiting_since = max(t for t in oldest if t is not None) if oldest else None
    return {
        "queued": queued.filter(due).count(),
        "scheduled": queued.exclude(due).count(),
        "processing": rows.filter(state=JobState.PROCESSING).count(),
        "errored": rows.filter(state=JobState.ERRORED).count(),
        "oldest_age": max((now - waiting_since).total_seconds(), 0.0) if waiting_since else 0.0,
    }


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The per-model gauges, for a URLconf (protect it as you would any internal view)."""
    registry = CollectorRegistry()
    registry.register(TableGauges())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


# -- serving ---------------------------------------------------------------------------


def worker_observers(port: int | None, address: str, handlers: Sequence[Handler]) -> list[Observer]:
    """The observer a ``runworker`` process adds: serving on ``port`` itself, or (a
    worker of a supervisor that serves) writing its figures for the supervisor."""
    if os.environ.get(METRICS_CHILD):
        return [WorkerMetrics(registry=None)]  # multiprocess mode: files, not a registry
    if port is None:
        return []
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    registry.register(TableGauges(lambda: _models_of(handlers)))
    start_http_server(port, address, registry=registry)
    logger.info("metrics served on %s:%d/metrics", address, port)
    return [metrics]


class SupervisorMetrics:
    """What a supervisor that serves metrics does: a directory for its workers' files
    (``env``), the server summing them, a dead worker's live gauges dropped
    (``exited``), the directory removed at the end (``close``)."""

    def __init__(self, port: int, address: str, handlers: Sequence[Handler]) -> None:
        self.directory = tempfile.mkdtemp(prefix="dbworker-metrics-")
        self.env = {"PROMETHEUS_MULTIPROC_DIR": self.directory, METRICS_CHILD: "1"}
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        registry.register(TableGauges(lambda: _models_of(handlers)))
        start_http_server(port, address, registry=registry)
        logger.info("metrics of all worker processes served on %s:%d/metrics", address, port)

    def exited(self, pid: int) -> None:
        multiprocess.mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _models_of(handlers: Sequence[Handler]) -> list[type[models.Model]]:
    return list({h.model: None for h in handlers if h.model is not None})
