"""Counts of a job table that stay cheap at any size.

Counting a million finished rows means reading a million index entries. So on
PostgreSQL and MariaDB, once the planner expects ``EXACT_BELOW`` rows or more:

- the jobs per state are exact for the states a job passes through (queued, errored,
  processing: few rows, found through the ``state`` index) and estimates for the
  final ones (the planner's row estimate from the table's statistics);
- the job list's paginator gives the planner's estimate of the filtered rows
  (``EstimatingPaginator.estimated``), and the admin does not count the whole table a
  second time (``show_full_result_count = False``).

Estimates are labelled as such wherever they are shown. On SQLite, and below
``EXACT_BELOW`` rows, every count is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.paginator import Paginator
from django.db import connections, router
from django.db.models import Count, Model, QuerySet
from django.utils.functional import cached_property

from ..sql.dialects import dialect_for
from ..states import FINAL_STATES, JobState

#: Below this many rows (the planner's estimate), counts are exact.
EXACT_BELOW = 100_000
#: The states counted exactly at any size (a job passes through them).
ACTIVE_STATES = (JobState.QUEUED, JobState.PROCESSING, JobState.ERRORED)


def estimated_rows(queryset: QuerySet[Any]) -> int | None:
    """The rows the planner expects ``queryset`` to return (None where the database
    gives no estimate, or when the query cannot be explained: an empty ``IN``, say)."""
    connection = connections[queryset.db]
    try:
        dialect = dialect_for(connection)
        sql, params = queryset.order_by().query.get_compiler(using=queryset.db).as_sql()
    except Exception:  # EmptyResultSet and the like: let the exact count answer
        return None
    return dialect.estimated_rows(connection, sql, params)


@dataclass
class StateCounts:
    """Jobs per state, and which of the figures are estimates."""

    counts: dict[str, int]
    estimated: frozenset[str]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def total_estimated(self) -> bool:
        return bool(self.estimated)


def state_counts(model: type[Model]) -> StateCounts:
    """Jobs of ``model`` per state: exact where cheap, estimated elsewhere."""
    rows = model._base_manager.using(router.db_for_read(model))
    whole = estimated_rows(rows.all())
    if whole is None or whole < EXACT_BELOW:
        counts = dict(rows.values_list("state").annotate(n=Count("pk")).order_by())
        return StateCounts({s: counts.get(s, 0) for s in JobState.values}, frozenset())
    active = dict(
        rows.filter(state__in=ACTIVE_STATES).values_list("state").annotate(n=Count("pk")).order_by()
    )
    counts = {}
    for state in JobState.values:
        if state in FINAL_STATES:
            counts[state] = estimated_rows(rows.filter(state=state)) or 0
        else:
            counts[state] = active.get(state, 0)
    return StateCounts(counts, frozenset(s.value for s in FINAL_STATES))


class EstimatingPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that counts exactly only when the planner expects fewer than
    ``EXACT_BELOW`` rows; otherwise ``count`` is the estimate and ``estimated`` is set."""

    estimated = False

    @cached_property
    def count(self) -> int:
        object_list: Any = self.object_list
        if isinstance(object_list, QuerySet):
            guess = estimated_rows(object_list)
            if guess is not None and guess >= EXACT_BELOW:
                self.estimated = True
                return guess
        return super().count
