"""Counts of a job table that stay cheap at any size, for the admin and the metrics.

Counting a million rows reads a million index entries. So on PostgreSQL and MariaDB a
count is the planner's estimate once it expects ``EXACT_BELOW`` rows or more (for the
whole table: the statistics are the whole table's), and a subset (a tenant's rows) is
counted up to ``EXACT_BELOW`` and said to hold "at least" that many past it. Below it,
and on SQLite, counts are exact. Whatever waits for later (a million jobs scheduled for
tomorrow), the oldest claimable job is found by index probes.
"""

from __future__ import annotations

import functools
import operator
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Count, Q, QuerySet

from .handler import Handler
from .sql.dialects import dialect_for
from .states import DEQUEUEABLE_STATES, JobState

#: Below this many rows (the planner's estimate), counts are exact.
EXACT_BELOW = 100_000


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


def bounded_count(rows: QuerySet[Any], limit: int | None = None) -> tuple[int, bool]:
    """The rows of ``rows``, counted up to ``limit`` (default ``EXACT_BELOW``), and
    whether there are more."""
    limit = EXACT_BELOW if limit is None else limit  # read at each call (tests change it)
    found = rows.order_by().values("pk")[: limit + 1].count()
    return min(found, limit), found > limit


def active_figures(
    rows: QuerySet[Any], handler: Handler | None, now: datetime, whole: bool = True
) -> dict[str, Any]:
    """Queued (claimable now), scheduled, processing, errored and the oldest claimable
    job's age of the jobs of ``rows`` that ``handler`` takes (all, if None). Each count
    is exact while small; past ``EXACT_BELOW`` rows the planner's estimate for the
    whole table (``whole``), or a lower bound for a subset (``marks`` says which)."""
    if handler is not None and handler.dequeue_filter is not None:
        rows = rows.filter(handler.dequeue_filter)
    due = Q(process_after__isnull=True) | Q(process_after__lte=now)
    wanted = {
        "queued": Q(state=JobState.QUEUED) & due,
        "scheduled": Q(state=JobState.QUEUED, process_after__gt=now),
        "processing": Q(state=JobState.PROCESSING),
        "errored": Q(state=JobState.ERRORED),
    }
    figures: dict[str, Any] = {}
    marks: dict[str, str] = {}
    exact: dict[str, Q] = {}
    for name, condition in wanted.items():
        if whole:
            guess = estimated_rows(rows.filter(condition))
            if guess is not None and guess >= EXACT_BELOW:
                figures[name], marks[name] = guess, "≈ "
                continue
            exact[name] = condition
        else:
            figures[name], more = bounded_count(rows.filter(condition))
            if more:
                marks[name] = "≥ "
    if exact:  # in one read of the rows they count (not of every active job)
        counted = rows.filter(functools.reduce(operator.or_, exact.values()))
        figures.update(counted.aggregate(**{n: Count("pk", filter=q) for n, q in exact.items()}))
    figures["marks"] = marks
    figures["oldest_age"] = oldest_claimable_age(rows, now)
    return figures


def oldest_claimable_age(rows: QuerySet[Any], now: datetime) -> float | None:
    """How long the oldest claimable job of ``rows`` has waited: the first of each state
    in the dequeue index (the lowest key, since its ``queued_at``), and the first due
    row of the waiting index not staged yet (since its ``process_after``). Index
    probes, whatever waits for later. Each state apart: on MariaDB a read of both went
    through the primary key from the lowest, past every finished job."""
    since = [
        queued_at
        for state in DEQUEUEABLE_STATES
        for queued_at in rows.filter(state=state, process_after__isnull=True)
        .order_by("pk")
        .values_list("queued_at", flat=True)[:1]
    ]
    since += list(
        rows.filter(state__in=DEQUEUEABLE_STATES, process_after__lte=now)
        .order_by("process_after")
        .values_list("process_after", flat=True)[:1]
    )
    return max((now - min(since)).total_seconds(), 0.0) if since else None
