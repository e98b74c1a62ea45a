"""Prometheus metrics: ``pip install "django-dbworker[prometheus]"``.

``runworker --metrics-port 9100`` serves, at ``/metrics``:

- per handler, from the worker: ``dbworker_jobs_finished_total{handler,outcome}``
  (``outcome="snoozed"``: the attempts that snoozed),
  ``dbworker_attempt_duration_seconds{handler}`` and
  ``dbworker_queue_wait_seconds{handler,queue}`` (histograms),
  ``dbworker_handler_threads{handler}`` and ``dbworker_handler_threads_busy{handler}``,
  ``dbworker_claims_total{handler}``, ``dbworker_jobs_claimed_total{handler}``,
  ``dbworker_claim_duration_seconds{handler}``, ``dbworker_resets_total{model}`` and
  ``dbworker_reset_failures_total{model}`` (the resetter inside the worker),
  ``dbworker_statement_errors_total{role}`` (the worker's own statements: claim,
  heartbeat, write). Every label value the worker knows at start (its handlers, each
  outcome, its models, each role) is there at 0 from the start, so ``increase()``
  sees the first increment;
- ``dbworker_jobs_enqueued_total{model,queue}``: the jobs this process enqueued (the
  ORM's enqueueing paths and ``django.tasks``), in any process that imports this
  module;
- read from the database at each scrape (``prometheus_gauges.TableGauges``): per job
  model ``dbworker_jobs{model,state}`` and
  ``dbworker_oldest_claimable_job_age_seconds{model}``,
  ``dbworker_live_workers{handler}``, per periodic schedule
  ``dbworker_schedule_ticks_skipped_total`` (ticks skipped because the job's unique
  key was held), and per consumer (label ``consumer``)
  ``dbworker_consumer_lag_rows``, ``dbworker_consumer_behind_seconds`` (against the
  table's head), ``dbworker_consumer_failing``, ``dbworker_consumer_paused`` and
  ``dbworker_consumer_running``.

The ``queue`` label holds at most ``MAX_QUEUE_LABELS`` values per handler (or model) and
process; further queues count as ``other``.

With ``--processes N`` the supervisor serves the sum of its worker processes (through
prometheus_client's multiprocess mode: each process writes its figures to files in a
directory the supervisor makes and removes). ``metrics_view`` serves the gauges read
from the database, and this process's enqueued counter, from Django itself (for
setups with no worker port), to users with the ``django_dbworker.view_metrics``
permission (superusers have it) or to requests that carry ``DBWORKER["METRICS_TOKEN"]``.
The metrics servers read the database for one scrape at a time and reuse what they
read for a second (``prometheus_gauges.OneAtATime``): one connection at most.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
    start_http_server,
)

from .. import signals
from ..exceptions import WorkerStartError
from ..handler import Handler
from ..runtime.events import Observer, Written
from ..runtime.outcome import OutcomeKind
from ..stats import DURATION_BUCKETS, OUTCOMES
from . import METRICS_CHILD
from .prometheus_enqueued import (  # noqa: F401 - importable from here as before
    ENQUEUED,
    MAX_QUEUE_LABELS,
    OTHER_QUEUE,
    TASKS_MODEL,
    QueueLabels,
    _running_queue_fields,
    queue_field_of,
)
from .prometheus_gauges import (  # noqa: F401 - importable from here as before
    CONSUMER_GAUGES,
    OneAtATime,
    TableGauges,
    consumer_families,
    schedule_families,
    table_figures,
)
from .prometheus_view import (  # noqa: F401 - importable from here as before
    METRICS_PERMISSION,
    _configured_handlers,
    metrics_view,
)

if TYPE_CHECKING:
    from ..runtime.attempt import Attempt
    from ..runtime.lane import Lane

logger = logging.getLogger("django_dbworker.metrics")

#: Seconds between two updates of the pool shares' gauges.
SHARES_EVERY = 5.0
#: Claim durations are short: their own buckets (seconds).
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
#: The ``outcome`` values of ``dbworker_jobs_finished_total``: the dashboard's, and
#: ``snoozed`` (``raise Snooze``: back in the queue for a time, no failure counted).
METRIC_OUTCOMES = (*OUTCOMES, "snoozed")
#: The ``role`` values of ``dbworker_statement_errors_total``.
ROLES = ("claim", "heartbeat", "write")


class WorkerMetrics(Observer):
    """The per-handler figures of one worker process (an observer of its events)."""

    def __init__(
        self, registry: CollectorRegistry | None, serve: Callable[[], None] | None = None
    ) -> None:
        """``serve``: starts serving ``registry``, once every series is at 0 (``attach``):
        a scrape never sees a series appear from nothing."""
        self._serve = serve

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
        self.queue_wait = metric(
            Histogram,
            "dbworker_queue_wait_seconds",
            "From when a job was ready (queued, or due) to when its attempt started.",
            ["handler", "queue"],
            buckets=DURATION_BUCKETS,
        )
        self.pool_slots = metric(
            Gauge,
            "dbworker_pool_slots",
            "Slots of the shared pool (runworker --pool); busy ones: the sum of "
            "dbworker_handler_threads_busy.",
            [],
            multiprocess_mode="livesum",
        )
        self.weight = metric(
            Gauge,
            "dbworker_handler_weight",
            "A handler's weight in the shared pool (runworker --pool).",
            ["handler"],
            multiprocess_mode="livemax",
        )
        self.pool_share = metric(
            Gauge,
            "dbworker_handler_pool_share",
            "A handler's share (0-1) of the jobs its worker's shared pool claimed over the "
            "last minutes (runworker --pool; across processes: rate of "
            "dbworker_jobs_claimed_total).",
            ["handler"],
            multiprocess_mode="liveall",
        )
        self._shares_at = 0.0
        self._queues = QueueLabels()
        signals.job_reset.connect(self._reset, dispatch_uid=f"dbworker-metrics-{id(self)}")

    def _reset(self, sender: type[models.Model], failed: bool, **kwargs: Any) -> None:
        (self.reset_failures if failed else self.resets).labels(sender._meta.label).inc()

    def attach(self, lanes: Sequence[Lane]) -> None:
        """Every series the worker knows of, at 0 (``increase()`` needs a first sample
        before the first increment)."""
        for lane in lanes:
            label = lane.label
            self.threads.labels(label).set(lane.num_handlers)
            self.busy.labels(label).set(0)
            for outcome in METRIC_OUTCOMES:
                self.finished_total.labels(label, outcome)
            self.claims.labels(label)
            self.jobs_claimed.labels(label)
            self.duration.labels(label)
            self.claim_duration.labels(label)
            field = lane.handler.queue_field
            if field:
                _running_queue_fields.setdefault(lane.model, field)
            known = getattr(lane.handler, "queues", None)  # the tasks handler's
            queues = known if field and isinstance(known, list | tuple) else []
            for queue in queues if field else [None]:
                self.queue_wait.labels(label, self._queues(label, queue))
        for model in {lane.model._meta.label for lane in lanes}:
            self.resets.labels(model)
            self.reset_failures.labels(model)
        for role in ROLES:
            self.errors.labels(role)
        pool = next((lane.pool for lane in lanes if lane.pool is not None), None)
        if pool is not None:
            self.pool_slots.set(pool.size)
            for lane in lanes:
                self.weight.labels(lane.label).set(lane.weight)
                self.pool_share.labels(lane.label).set(0)
        if self._serve is not None:
            self._serve()
            self._serve = None

    def claimed(self, lane: Lane, jobs: Sequence[Any], seconds: float) -> None:
        self.claims.labels(lane.label).inc()
        self.jobs_claimed.labels(lane.label).inc(len(jobs))
        self.claim_duration.labels(lane.label).observe(seconds)
        if lane.pool is not None and time.monotonic() - self._shares_at >= SHARES_EVERY:
            self._shares_at = time.monotonic()
            for label, share in lane.pool.shares().items():
                self.pool_share.labels(label).set(share)

    def started(self, attempt: Attempt) -> None:
        lane, job = attempt.lane, attempt.job
        self.busy.labels(lane.label).inc()
        ready = job.queued_at
        due = getattr(job, "process_after", None)
        if due is not None and (ready is None or due > ready):
            ready = due
        if ready is not None:
            field = lane.handler.queue_field
            queue = self._queues(lane.label, getattr(job, field, None) if field else None)
            wait = (timezone.now() - ready).total_seconds()
            self.queue_wait.labels(lane.label, queue).observe(max(wait, 0.0))

    def ended(self, attempt: Attempt) -> None:
        self.busy.labels(attempt.lane.label).dec()

    def finished(self, lane: Lane, written: Sequence[Written]) -> None:
        histogram = self.duration.labels(lane.label)
        counts: dict[str, int] = {}
        for _, outcome, state in written:
            key = "lost" if state is None else state
            if state == "queued":
                key = "snoozed" if outcome.kind is OutcomeKind.SNOOZED else "requeued"
            counts[key] = counts.get(key, 0) + 1
            histogram.observe(outcome.duration)
        for key, count in counts.items():
            self.finished_total.labels(lane.label, key).inc(count)

    def statement_failed(self, role: str) -> None:
        self.errors.labels(role).inc()

    def close(self) -> None:
        signals.job_reset.disconnect(dispatch_uid=f"dbworker-metrics-{id(self)}")


# -- serving ---------------------------------------------------------------------------


def _gauges(handlers: Sequence[Handler]) -> OneAtATime:
    """The database gauges of a metrics server: its handlers' models and names, read
    for one scrape at a time (one connection) and reused for ``REUSE_FOR`` seconds."""
    return OneAtATime(
        TableGauges(
            lambda: _models_of(handlers),
            lambda: [h.get_name() for h in handlers] or _configured_handlers(),
        )
    )


def worker_observers(port: int | None, address: str, handlers: Sequence[Handler]) -> list[Observer]:
    """The observer a ``runworker`` process adds: serving on ``port`` itself, or (a
    worker of a supervisor that serves) writing its figures for the supervisor."""
    if os.environ.get(METRICS_CHILD):
        return [WorkerMetrics(registry=None)]  # multiprocess mode: files, not a registry
    if port is None:
        return []
    registry = CollectorRegistry()
    registry.register(_gauges(handlers))
    registry.register(ENQUEUED)

    def serve() -> None:
        try:
            start_http_server(port, address, registry=registry)
        except OSError as exc:  # the port is taken, or the address is not this host's
            raise WorkerStartError(f"cannot serve metrics on {address}:{port}: {exc}") from None
        logger.info("metrics served on %s:%d/metrics", address, port)

    return [WorkerMetrics(registry, serve)]


class SupervisorMetrics:
    """What a supervisor that serves metrics does: a directory for its workers' files
    (``env``), the server summing them, a dead worker's live gauges dropped
    (``exited``), the directory removed at the end (``close``)."""

    def __init__(self, port: int, address: str, handlers: Sequence[Handler]) -> None:
        self.directory = tempfile.mkdtemp(prefix="dbworker-metrics-")
        self.env = {"PROMETHEUS_MULTIPROC_DIR": self.directory, METRICS_CHILD: "1"}
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        registry.register(_gauges(handlers))
        start_http_server(port, address, registry=registry)
        logger.info("metrics of all worker processes served on %s:%d/metrics", address, port)

    def exited(self, pid: int) -> None:
        multiprocess.mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _models_of(handlers: Sequence[Handler]) -> list[type[models.Model]]:
    return list({h.model: None for h in handlers if h.model is not None})
