"""The package's own tables in the admin when job tables live on several databases: the
pauses, schedules, audit trail and workers of each database are kept beside its jobs
(``django_dbworker.databases``), so their lists offer a "database" filter, and a row's
page reads the database its list showed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.contrib import admin
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest, QueryDict

from ..databases import everywhere

PARAMETER = "database"


class DatabaseFilter(admin.SimpleListFilter):
    """Which database's rows the list shows: the router's for the model (the first
    choice), or another that holds job tables. Shown only when there are several."""

    title = "database"
    parameter_name = PARAMETER

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        home = router.db_for_read(model_admin.model)
        return [(alias, alias) for alias in everywhere(model_admin.model) if alias != home]

    def choices(self, changelist: Any) -> Iterator[Any]:
        choices: list[Any] = list(super().choices(changelist))
        if choices:  # "All" is the router's database for the model, no more
            choices[0]["display"] = router.db_for_read(changelist.model)
        yield from choices

    def get_facet_counts(self, pk_attname: str, filtered_qs: QuerySet[Any]) -> dict[str, Any]:
        return {}  # counts of other databases: not in one query

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset  # AcrossDatabases.get_queryset reads the chosen database


class AcrossDatabases:
    """For a ``ModelAdmin`` of one of the package's tables: its queryset reads the
    database the request chose (the list's filter, or the filters the list hands to a
    row's page in ``_changelist_filters``); the router's otherwise."""

    def database(self, request: HttpRequest) -> str | None:
        alias = request.GET.get(PARAMETER)
        if alias is None and request.GET.get("_changelist_filters"):
            alias = QueryDict(request.GET["_changelist_filters"]).get(PARAMETER)
        model = self.model  # type: ignore[attr-defined]
        return alias if alias in everywhere(model) else None

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        alias = self.database(request)
        return queryset.using(alias) if alias is not None else queryset
