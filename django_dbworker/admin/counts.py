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

Estimates come from the statistics of the whole table: they are used only for a user
who sees the whole table (``scope.Visible.whole``). For a user whose ``get_queryset``
is a subset (a tenant's jobs) every count is of that subset, exact, and bounded: a
final state, and the paginator, count up to ``EXACT_BELOW`` rows and say "at least"
past it (an index on the subset's field and ``state`` keeps them cheap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Count, QuerySet
from django.utils.functional import cached_property

from ..sql.dialects import dialect_for
from ..states import FINAL_STATES, JobState
from .scope import Visible

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
    """Jobs per state, and which of the figures are estimates, or lower bounds."""

    counts: dict[str, int]
    estimated: frozenset[str]
    #: States counted up to ``EXACT_BELOW`` only, with more rows than that.
    at_least: frozenset[str] = frozenset()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def total_estimated(self) -> bool:
        return bool(self.estimated)

    @property
    def total_at_least(self) -> bool:
        return bool(self.at_least)


def _per_state(rows: QuerySet[Any]) -> dict[str, int]:
    return dict(rows.values_list("state").annotate(n=Count("pk")).order_by())


def bounded_count(rows: QuerySet[Any], limit: int | None = None) -> tuple[int, bool]:
    """The rows of ``rows``, counted up to ``limit`` (default ``EXACT_BELOW``), and
    whether there are more."""
    limit = EXACT_BELOW if limit is None else limit
    found = rows.order_by().values("pk")[: limit + 1].count()
    return min(found, limit), found > limit


def state_counts(visible: Visible) -> StateCounts:
    """Jobs per state of the rows a user sees: exact where cheap, estimated elsewhere
    (the whole table only), counted up to ``EXACT_BELOW`` for a subset."""
    rows = visible.rows
    if not visible.whole:
        return _subset_counts(rows)
    whole = estimated_rows(rows.all())
    if whole is None or whole < EXACT_BELOW:
        counts = _per_state(rows)
        return StateCounts({s: counts.get(s, 0) for s in JobState.values}, frozenset())
    active = _per_state(rows.filter(state__in=ACTIVE_STATES))
    counts = {}
    for state in JobState.values:
        if state in FINAL_STATES:
            counts[state] = estimated_rows(rows.filter(state=state)) or 0
        else:
            counts[state] = active.get(state, 0)
    return StateCounts(counts, frozenset(s.value for s in FINAL_STATES))


def _subset_counts(rows: QuerySet[Any]) -> StateCounts:
    """The exact counts of a subset; the final states' up to ``EXACT_BELOW`` each."""
    if not bounded_count(rows)[1]:
        counts = _per_state(rows)
        return StateCounts({s: counts.get(s, 0) for s in JobState.values}, frozenset())
    active = _per_state(rows.filter(state__in=ACTIVE_STATES))
    counts, at_least = {}, set()
    for state in JobState.values:
        if state in FINAL_STATES:
            counts[state], more = bounded_count(rows.filter(state=state))
            if more:
                at_least.add(state)
        else:
            counts[state] = active.get(state, 0)
    return StateCounts(counts, frozenset(), frozenset(at_least))


class EstimatingPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that counts exactly only when the planner expects fewer than
    ``EXACT_BELOW`` rows; otherwise ``count`` is the estimate and ``estimated`` is set.
    With ``estimates=False`` (a user who sees a subset of the table: the planner's
    figures come from the whole table) it counts up to ``EXACT_BELOW`` rows and sets
    ``at_least`` past it."""

    estimated = False
    at_least = False

    def __init__(self, *args: Any, estimates: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.estimates = estimates

    @cached_property
    def count(self) -> int:
        object_list: Any = self.object_list
        if isinstance(object_list, QuerySet):
            if not self.estimates:
                found, self.at_least = bounded_count(object_list)
                return found
            guess = estimated_rows(object_list)
            if guess is not None and guess >= EXACT_BELOW:
                self.estimated = True
                return guess
        return super().count
