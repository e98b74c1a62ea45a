"""Counts of a job table that stay cheap at any size.

Counting a million finished rows means reading a million index entries. So on
PostgreSQL and MariaDB, once the planner expects ``EXACT_BELOW`` rows or more:

- the jobs per state are estimates for the final states (the planner's row estimate
  from the table's statistics), and for a state a job passes through (queued,
  errored, processing) once the planner expects ``EXACT_BELOW`` rows of it there (a
  million jobs for later); below that they are exact, through the ``state`` index;
- the job list's paginator gives the planner's estimate of the filtered rows
  (``EstimatingPaginator.estimated``), and the admin does not count the whole table a
  second time (``show_full_result_count = False``).

Estimates are labelled as such wherever they are shown. On SQLite, and below
``EXACT_BELOW`` rows, every count is exact.

Estimates come from the statistics of the whole table: they are used only for a user
who sees the whole table (``scope.Visible.whole``). For a user whose ``get_queryset``
is a subset (a tenant's jobs) every count is of that subset, exact, and bounded: a
state, and the paginator, count up to ``EXACT_BELOW`` rows and say "at least" past
it (an index on the subset's field and ``state`` keeps them cheap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Count, QuerySet
from django.utils.functional import cached_property

from .. import figures
from ..figures import bounded_count, estimated_rows
from ..states import FINAL_STATES, JobState
from .scope import Visible

__all__ = ["EstimatingPaginator", "StateCounts", "bounded_count", "state_counts"]


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


def state_counts(visible: Visible) -> StateCounts:
    """Jobs per state of the rows a user sees: exact where cheap, estimated elsewhere
    (the whole table only), counted up to ``EXACT_BELOW`` for a subset."""
    rows = visible.rows
    if not visible.whole:
        return _subset_counts(rows)
    whole = estimated_rows(rows.all())
    if whole is None or whole < figures.EXACT_BELOW:
        counts = _per_state(rows)
        return StateCounts({s: counts.get(s, 0) for s in JobState.values}, frozenset())
    counts, estimated = {}, set()
    for state in JobState.values:
        guess = estimated_rows(rows.filter(state=state))
        # A state a job passes through is counted exactly while it holds few rows (jobs
        # for later can make queued and errored hold millions).
        if state in FINAL_STATES or (guess is not None and guess >= figures.EXACT_BELOW):
            counts[state] = guess or 0
            estimated.add(state)
    exact = [state for state in JobState.values if state not in estimated]
    if exact:
        found = _per_state(rows.filter(state__in=exact))
        counts.update({state: found.get(state, 0) for state in exact})
    return StateCounts(counts, frozenset(estimated))


def _subset_counts(rows: QuerySet[Any]) -> StateCounts:
    """The exact counts of a subset, each state's up to ``EXACT_BELOW``."""
    if not bounded_count(rows)[1]:
        counts = _per_state(rows)
        return StateCounts({s: counts.get(s, 0) for s in JobState.values}, frozenset())
    counts, at_least = {}, set()
    for state in JobState.values:
        counts[state], more = bounded_count(rows.filter(state=state))
        if more:
            at_least.add(state)
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
            if guess is not None and guess >= figures.EXACT_BELOW:
                self.estimated = True
                return guess
        return super().count
