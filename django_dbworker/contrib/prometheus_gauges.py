"""The Prometheus figures read from the database at each scrape (``TableGauges``):
jobs per model and state, the oldest claimable job's age, the live workers per
handler, the schedules' skipped ticks, and the consumers' figures against their
tables' heads (``consumers.status``).

Used by the metrics servers of ``runworker`` and its supervisor (which close the
scrape thread's connections after each scrape: that thread serves nothing else) and
by ``metrics_view`` (which must not: it runs in a request's thread).

A metrics server answers each scrape in a thread of its own: ``OneAtATime`` lets one
scrape at a time read the database and serves what it read to the scrapes of the next
``REUSE_FOR`` seconds, so any number of scrapes at once costs one collection and one
connection (per database), never one each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

from django.db import connections, models, router
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..databases import everywhere
from ..figures import active_figures
from ..models import WorkerProcess
from ..models import job_models as all_job_models

logger = logging.getLogger("django_dbworker.metrics")

#: Seconds a collection of the database gauges is served again to the scrapes that follow.
REUSE_FOR = 1.0
#: Seconds a scrape waits for another one's collection before it gets the last one read.
WAIT_AT_MOST = 10.0


class OneAtATime(Collector):
    """``collector``'s figures read by one scrape at a time and reused for ``reuse_for``
    seconds: scrapes that arrive together wait for the one collecting, then share
    its figures. A scrape that waited ``wait`` seconds (the database is slow or gone)
    gets the last figures read (none before the first) rather than a collection of
    its own."""

    def __init__(
        self, collector: Collector, reuse_for: float = REUSE_FOR, wait: float = WAIT_AT_MOST
    ) -> None:
        self.collector = collector
        self.reuse_for = reuse_for
        self.wait = wait
        self._lock = threading.Lock()
        self._families: list[Metric] = []
        self._read_at: float | None = None

    def collect(self) -> Iterator[Metric]:
        if not self._lock.acquire(timeout=self.wait):
            logger.warning(
                "metrics: the database gauges are still being read after %.0f s: "
                "serving the last figures read",
                self.wait,
            )
            return iter(list(self._families))
        try:
            at = self._read_at
            if at is None or time.monotonic() - at >= self.reuse_for:
                self._families = list(self.collector.collect())
                self._read_at = time.monotonic()
            return iter(list(self._families))
        finally:
            self._lock.release()


class TableGauges(Collector):
    """``dbworker_jobs{model,state}`` and ``dbworker_oldest_claimable_job_age_seconds``
    of ``job_models`` (default: every ``WorkerJob`` model), read at each scrape with
    statements the partial indexes answer (the oldest claimable job is the lowest id);
    ``dbworker_live_workers{handler}`` from the worker registry (``handlers``: names
    shown at 0 when no live worker runs them); the consumer gauges
    (``CONSUMER_GAUGES``) of every checkpoint row; the schedules' skipped ticks."""

    def __init__(
        self,
        job_models: Callable[[], Iterable[type[models.Model]]] | None = None,
        handlers: Callable[[], Iterable[str]] | None = None,
        *,
        close_connections: bool = True,
    ):
        self.job_models = job_models or all_job_models
        self.handlers = handlers or (lambda: ())
        #: Close the scrape thread's connections after each scrape (a metrics server's
        #: own thread); never in a request's thread (``metrics_view``).
        self.close_connections = close_connections

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
            workers = live_workers_family(self.handlers())
            consumers = consumer_families()
            schedules = schedule_families()
        finally:
            if self.close_connections:
                for conn in connections.all(initialized_only=True):
                    conn.close()
        yield jobs
        yield age
        yield from workers
        yield from consumers
        yield from schedules


def live_workers_family(known: Iterable[str]) -> list[GaugeMetricFamily]:
    """``dbworker_live_workers{handler}``: the registry's live worker processes that
    run each handler (consumers as ``consumer:<name>``), 0 for the ``known`` names none
    runs. Bounded by the handlers deployed, not by the jobs."""
    family = GaugeMetricFamily(
        "dbworker_live_workers",
        "Live worker processes (registry heartbeat within five intervals) that run each "
        "handler; consumers as consumer:<name>.",
        labels=["handler"],
    )
    rows: list[WorkerProcess] = []
    for alias in everywhere(WorkerProcess):  # a registry beside each database's jobs
        try:
            rows += WorkerProcess.objects.using(alias)
        except Exception as exc:
            logger.warning("metrics: cannot read the worker registry of %r: %s", alias, exc)
    counts = dict.fromkeys(known, 0)
    for worker in rows:  # a worker's row in each database lists that database's handlers
        if worker.is_alive() and isinstance(worker.handlers, list):
            for name in worker.handlers:
                counts[str(name)] = counts.get(str(name), 0) + 1
    for name, count in sorted(counts.items()):
        family.add_metric([name], count)
    return [family]


#: The consumer gauges: name, help, and the figure of a ``ConsumerStatus``.
CONSUMER_GAUGES: list[tuple[str, str, Callable[[Any], float]]] = [
    (
        "dbworker_consumer_lag_rows",
        "Positions between a consumer's checkpoint and its table's head, read now.",
        lambda status: status.lag,
    ),
    (
        "dbworker_consumer_behind_seconds",
        "Seconds since a consumer was last seen at its table's head (0: at the head).",
        lambda status: (status.behind_for or timedelta(0)).total_seconds(),
    ),
    (
        "dbworker_consumer_failing",
        "1 while a consumer's batches fail or hang max_failures times in a row or more.",
        lambda status: status.row.failing,
    ),
    (
        "dbworker_consumer_paused",
        "1 while a consumer is paused.",
        lambda status: status.row.paused,
    ),
    (
        "dbworker_consumer_running",
        "1 while a live worker runs the consumer.",
        lambda status: status.running,
    ),
]


def consumer_families() -> list[GaugeMetricFamily]:
    """The consumer gauges, one sample per checkpoint row (read at each scrape)."""
    from ..consumers.models import ConsumerCheckpoint
    from ..consumers.status import statuses

    families = [
        GaugeMetricFamily(name, text, labels=["consumer"]) for name, text, _ in CONSUMER_GAUGES
    ]
    alias = router.db_for_read(ConsumerCheckpoint)
    try:
        found = statuses(ConsumerCheckpoint.objects.using(alias), alias)
    except Exception as exc:
        logger.warning("metrics: cannot read the consumers: %s", exc)
        return []
    for status in found:
        for family, (_, _, figure) in zip(families, CONSUMER_GAUGES, strict=True):
            family.add_metric([status.name], float(figure(status)))
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
    rows: list[tuple[str, int]] = []
    for alias in everywhere(Schedule):  # beside their handlers' jobs
        try:
            rows += Schedule.objects.using(alias).values_list("name", "skipped_ticks")
        except Exception as exc:
            logger.warning("metrics: cannot read the schedules of %r: %s", alias, exc)
    for name, skipped in rows:
        family.add_metric([name], float(skipped))
    return [family]


def table_figures(model: type[models.Model]) -> dict[str, float]:
    """The per-state counts and the oldest claimable job's age of one job model: exact
    below ``figures.EXACT_BELOW`` rows, the planner's estimates past it (a million jobs
    for later are not counted at each scrape)."""
    rows = model._base_manager.using(router.db_for_read(model))
    found = active_figures(rows, None, timezone.now())
    return {
        name: float(found[name]) for name in ("queued", "scheduled", "processing", "errored")
    } | {"oldest_age": found["oldest_age"] or 0.0}
