"""The operator's operations on jobs: cancel, retry, run now, schedule.

They work on any queryset of a ``WorkerJob`` model, whatever its default manager
returns (the admin calls them; ``WorkerJobQuerySet`` delegates to them). Each is
one guarded statement::

    UPDATE <job table> SET …
     WHERE <pk> IN (<the queryset's primary keys>) AND <the states it applies to>
    RETURNING <pk>, …

PostgreSQL checks the guard again on the newest version of each row when the
UPDATE gets the row's lock, and SQLite runs one writer at a time, so a job that a
worker finishes while the operator's statement runs is judged by the state the
worker left it in: the operation can never race a worker into an inconsistent
row, nor miss a job between two statements (MariaDB, without ``RETURNING``: a
locking read, the UPDATE and a read, in one transaction). Times come from the
database's clock (``Now()``; on MariaDB ``UTC_TIMESTAMP``, whatever the session's
time zone), the clock the workers' claims compare ``process_after`` with. They run on
the caller's connection and leave its session as it was (on MariaDB the isolation
level, ``time_zone`` and ``sql_mode`` a project sets there). Table
and column names come from the model (``db_table``, ``db_column``), quoted by the
backend; every value travels as a parameter. Each operation returns the primary
keys it changed (for the caller's audit trail). ``retry`` and ``run_now`` wake
idle workers (``notify_workers``, on PostgreSQL at commit).
"""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from .control.unique import holder_of, is_key_violation, unique_constraints
from .sql.notify import notify_workers
from .sql.operator import GuardedUpdate
from .states import DEQUEUEABLE_STATES, JobState

__all__ = [
    "RETRYABLE_STATES",
    "Cancellation",
    "Retried",
    "cancel",
    "retry",
    "run_now",
    "schedule",
]

#: States ``retry`` queues again.
RETRYABLE_STATES = (JobState.FAILED, JobState.ERRORED, JobState.CANCELED)
#: The ``failure_message`` of a job canceled before a worker took it.
CANCELED_BEFORE_IT_RAN = "canceled before it ran"
#: The start of the ``failure_message`` of an errored job canceled before its retry;
#: the last error follows.
CANCELED_AWAITING_RETRY = "canceled while waiting for its retry; last error: "


class Cancellation(NamedTuple):
    """What ``cancel`` did, as primary keys."""

    #: Queued or errored jobs, now ``canceled``.
    canceled: list[Any]
    #: Processing jobs whose worker stops them at its next heartbeat (``cancel`` set).
    requested: list[Any]


def _in(column: str, states: tuple[JobState, ...]) -> tuple[str, list[str]]:
    return f"{column} IN ({', '.join(['%s'] * len(states))})", [s.value for s in states]


def cancel(queryset: QuerySet[Any]) -> Cancellation:
    """Cancel the jobs of ``queryset``: queued and errored jobs become ``canceled`` now
    (``failure_message`` "canceled before it ran", or for an errored job "canceled
    while waiting for its retry; last error: " and its last error); processing jobs
    get the ``cancel`` flag, and their worker stops them at its next heartbeat. Other
    jobs, and processing jobs already asked to stop, are left alone.
    """
    update = GuardedUpdate(queryset)
    state, flag = update.col("state"), update.col("cancel")
    message = update.col("failure_message")
    last_error = update.concat("%s", f"COALESCE({message}, '')")
    waiting, waiting_params = _in(state, DEQUEUEABLE_STATES)
    with update.transaction():
        rows = update.run(
            f"{flag} = %s, "
            f"{state} = CASE WHEN {waiting} THEN %s ELSE {state} END, "
            f"{update.col('finished_at')} = CASE WHEN {waiting} THEN {update.now} "
            f"ELSE {update.col('finished_at')} END, "
            f"{message} = CASE WHEN {state} = %s THEN %s "
            f"WHEN {state} = %s THEN {last_error} "
            f"ELSE {message} END",
            [
                update.prep("cancel", True),
                *waiting_params,
                JobState.CANCELED.value,
                *waiting_params,
                JobState.QUEUED.value,
                CANCELED_BEFORE_IT_RAN,
                JobState.ERRORED.value,
                CANCELED_AWAITING_RETRY,
            ],
            f"{waiting} OR ({state} = %s AND NOT {flag})",
            [*waiting_params, JobState.PROCESSING.value],
            returning=state,
        )
    return Cancellation(
        canceled=[pk for pk, new_state in rows if new_state == JobState.CANCELED],
        requested=[pk for pk, new_state in rows if new_state == JobState.PROCESSING],
    )


class Retried(NamedTuple):
    """What ``retry`` did, as primary keys."""

    #: Jobs queued again.
    retried: list[Any]
    #: Jobs left as they were because another active job holds a unique key they need
    #: (``unique_job_constraint``): the key of each, by the key of its holder (None: it
    #: finished meanwhile; retry again).
    held: dict[Any, Any]


def retry(queryset: QuerySet[Any], reset_counters: bool = False) -> Retried:
    """Queue the failed, errored and canceled jobs of ``queryset`` again, to run now.

    Counters are kept by default: a job past its retry budget then gets one more
    attempt. ``reset_counters=True`` zeroes ``num_failures``, ``num_resets`` and
    ``num_snoozes``, giving it its whole budget again. The previous attempt's ``failure_message``
    and ``worker_hostname`` stay until a worker claims the job.

    A job whose unique key (``unique_job_constraint``) another active job holds is not
    queued again (the database would refuse it): it is in ``held``, with the job that
    holds its key, and the others are retried.
    """
    update = GuardedUpdate(queryset)
    assignments = [
        f"{update.col('state')} = %s",
        f"{update.col('cancel')} = %s",
        f"{update.col('queued_at')} = {update.now}",
        *(
            f"{update.col(name)} = NULL"
            for name in ("process_after", "started_at", "finished_at", "last_heartbeat_at")
        ),
    ]
    params: list[Any] = [JobState.QUEUED.value, update.prep("cancel", False)]
    if reset_counters:
        assignments += [
            f"{update.col(name)} = %s" for name in ("num_failures", "num_resets", "num_snoozes")
        ]
        params += [0, 0, 0]
    guard, guard_params = _in(update.col("state"), RETRYABLE_STATES)
    assigned = ", ".join(assignments)
    held: dict[Any, Any] = {}
    with update.transaction():
        if not unique_constraints(update.model):
            rows = update.run(assigned, params, guard, guard_params)
        else:
            try:
                with transaction.atomic(using=update.alias):  # a held key undoes this only
                    rows = update.run(assigned, params, guard, guard_params)
            except IntegrityError as exc:
                if not is_key_violation(exc, update.model):
                    raise
                rows, held = _retry_each(queryset, update.alias, assigned, params, guard_params)
        if rows:
            notify_workers(update.model, update.alias)
    return Retried([pk for (pk,) in rows], held)


def _retry_each(
    queryset: QuerySet[Any], alias: str, assigned: str, params: list[Any], guard_params: list[Any]
) -> tuple[list[tuple[Any, ...]], dict[Any, Any]]:
    """``retry`` one job at a time, each in a savepoint: those whose key is held stay."""
    model = queryset.model
    manager = model._base_manager.db_manager(alias)
    candidates = queryset.using(alias).filter(state__in=RETRYABLE_STATES).order_by("pk")
    rows: list[tuple[Any, ...]] = []
    held: dict[Any, Any] = {}
    for pk in candidates.values_list("pk", flat=True):
        update = GuardedUpdate(manager.filter(pk=pk))
        guard, _ = _in(update.col("state"), RETRYABLE_STATES)
        try:
            with transaction.atomic(using=alias):
                rows += update.run(assigned, params, guard, guard_params)
        except IntegrityError as exc:
            if not is_key_violation(exc, model):
                raise
            holder = holder_of(manager.get(pk=pk), alias)
            held[pk] = None if holder is None else holder.pk
    return rows, held


def run_now(queryset: QuerySet[Any]) -> list[Any]:
    """Queued or errored jobs of ``queryset`` scheduled for later (by the database's
    clock) become claimable now."""
    update = GuardedUpdate(queryset)
    after = update.col("process_after")
    waiting, waiting_params = _in(update.col("state"), DEQUEUEABLE_STATES)
    with update.transaction():
        # Claimable at once (no process_after: in the dequeue index), queued from now.
        rows = update.run(
            f"{update.col('queued_at')} = {update.now}, {after} = NULL",
            [],
            f"{waiting} AND {after} > {update.now}",
            waiting_params,
        )
        if rows:
            notify_workers(update.model, update.alias)
    return [pk for (pk,) in rows]


def schedule(queryset: QuerySet[Any], when: datetime.datetime) -> list[Any]:
    """Queued or errored jobs of ``queryset`` are not claimed before ``when``."""
    update = GuardedUpdate(queryset)
    waiting, waiting_params = _in(update.col("state"), DEQUEUEABLE_STATES)
    with update.transaction():
        rows = update.run(
            f"{update.col('process_after')} = %s",
            [update.prep("process_after", when)],
            waiting,
            waiting_params,
        )
        if rows:  # the workers read when their next job comes due again
            notify_workers(update.model, update.alias)
    return [pk for (pk,) in rows]
