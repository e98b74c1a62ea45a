"""What one user of a job model's admin may see: the rows of ``get_queryset(request)``.

Every figure the admin shows of a job model (the counts per state, the paginator's
count, the limits panel, the dashboard, "why is this job not running?") is built from
those rows. Figures that are not per row (the planner's estimates, the per-minute
``JobStats``, a rate bucket's tokens, the busy slots of a shared pool) describe every
job of the model: they are shown only to a user whose rows are the whole table
(``Visible.whole``): an admin whose ``get_queryset`` adds no condition for that user,
as ``ModelAdmin.get_queryset`` does on a model whose default manager filters nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import router
from django.db.models import QuerySet


@dataclass(frozen=True)
class Visible:
    """The rows a user may see (``rows``), and whether they are the whole table."""

    rows: QuerySet[Any]
    whole: bool

    @classmethod
    def of(cls, queryset: QuerySet[Any]) -> Visible:
        """The rows of ``queryset``; the whole table read plainly (without the
        admin's annotations or joins) when it is the whole table."""
        rows = queryset.order_by()
        if whole_table(rows):
            return cls(rows.model._base_manager.using(rows.db), True)
        return cls(rows, False)

    @classmethod
    def only(cls, obj: Any) -> Visible:
        """No request at hand: the job itself and nothing else."""
        model = type(obj)
        return cls(model._base_manager.using(router.db_for_read(model)).filter(pk=obj.pk), False)


def whole_table(queryset: QuerySet[Any]) -> bool:
    """Whether ``queryset`` reads every row of its model's table: no condition (a
    ``filter``, ``exclude``, ``none()``, a manager's own filter), no slice, no union,
    no extra tables, on the database the model is read from. Anything else is taken
    for a subset, so no figure of the whole table is shown."""
    query = queryset.query
    return (
        not query.where
        and not query.is_sliced
        and not query.combinator
        and not query.extra_tables
        and not query.extra
        and not query.distinct_fields
        and queryset.db == router.db_for_read(queryset.model)
    )
