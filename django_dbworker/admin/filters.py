"""The job list's filters: heartbeat (stalled or live), cancel requested, worker."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from .. import conf
from ..handler import Handler, HandlerImportError, import_handler, seconds
from ..states import JobState


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
    title = "cancel requested"
    parameter_name = "cancel_requested"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "yes"), ("no", "no")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(cancel=self.value() == "yes")
        return queryset


class WorkerHostnameFilter(admin.SimpleListFilter):
    title = "worker"
    parameter_name = "worker"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = (
            model_admin.model._base_manager.exclude(worker_hostname="")
            .order_by()
            .values_list("worker_hostname", flat=True)
            .distinct()[:50]
        )
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(worker_hostname=self.value()) if self.value() else queryset
