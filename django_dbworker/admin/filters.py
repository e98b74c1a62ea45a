"""The job list's filters: waiting for (nothing: claimable now; or a time), heartbeat
(stalled or live), cancel requested, worker.

Each one is answered by an index at any size: the state index (the rows being
processed), or the worker index; the worker filter's choices come from the worker
registry (a small table), not from the job table. Without the opt-in worker index
(``models.worker_index``) the worker filter shows the worker's running jobs only
(the state index).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db import router
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from .. import conf
from ..handler import Handler, HandlerImportError, import_handler, seconds
from ..models import WorkerProcess
from ..states import DEQUEUEABLE_STATES, JobState


def stalled_max_age(model: type[Model]) -> float:
    """The smallest ``stalled_max_age`` of the configured handlers of ``model``."""
    ages = []
    for path_ in conf.get("HANDLERS"):
        try:
            handler = import_handler(path_)
        except HandlerImportError:
            continue
        if handler.model is model:
            ages.append(seconds(handler.stalled_max_age) or 0.0)
    return min(ages) if ages else seconds(Handler.stalled_max_age) or 30.0


class DueFilter(admin.SimpleListFilter):
    """Queued and errored jobs by what they wait for: nothing (claimable now: the
    dequeue index), or a time (``process_after`` set: scheduled for later, a retry's
    delay, or come due and not yet staged by a worker: the waiting index). Each is read
    newest first from its index, whatever the other holds."""

    title = "waiting for"
    parameter_name = "due"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("now", "nothing (claimable now)"), ("later", "a time (scheduled, retry delay)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in ("now", "later"):
            return queryset
        waiting = queryset.filter(state__in=[s.value for s in DEQUEUEABLE_STATES])
        return waiting.filter(process_after__isnull=self.value() == "now")


class StalledFilter(admin.SimpleListFilter):
    title = "heartbeat"
    parameter_name = "heartbeat"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("stalled", "stalled (processing, old heartbeat)"), ("live", "live")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in ("stalled", "live"):
            return queryset
        cutoff = timezone.now() - timedelta(seconds=stalled_max_age(queryset.model))
        stale = Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=cutoff)
        processing = queryset.filter(state=JobState.PROCESSING)
        return processing.filter(stale) if self.value() == "stalled" else processing.exclude(stale)


class CancelRequestedFilter(admin.SimpleListFilter):
    """Running jobs whose cancellation was requested (``yes``), or not (``no``): the
    flag only means something while a job runs."""

    title = "cancel requested"
    parameter_name = "cancel_requested"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "yes (running)"), ("no", "no (running)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(state=JobState.PROCESSING, cancel=self.value() == "yes")
        return queryset


class WorkerHostnameFilter(admin.SimpleListFilter):
    """The jobs of one worker (``host:pid:random``): the workers the registry knows
    (alive, or silent and not yet pruned), and the one selected. All its jobs where
    the model declares the worker index, else the ones it runs now."""

    title = "worker"
    parameter_name = "worker"
    #: Most workers listed.
    most = 100

    def __init__(
        self, request: HttpRequest, params: Any, model: type[Model], model_admin: Any
    ) -> None:
        super().__init__(request, params, model, model_admin)
        self.every_job = any(
            list(index.fields[:1]) == ["worker_hostname"] for index in model._meta.indexes
        )
        if not self.every_job:
            self.title = "worker (running jobs)"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # The workers that register beside this model's jobs (django_dbworker.databases).
        registry = WorkerProcess.objects.using(router.db_for_read(model_admin.model))
        names = list(
            registry.order_by("worker_id").values_list("worker_id", flat=True)[: self.most]
        )
        selected = self.value()
        if selected and selected not in names:
            names.append(selected)
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        if not self.every_job:  # no index for a worker's finished jobs: the running ones
            queryset = queryset.filter(state=JobState.PROCESSING)
        return queryset.filter(worker_hostname=self.value())
