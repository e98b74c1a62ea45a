"""What ``WorkerJob.Meta`` declares and a job model keeps: the columns the worker owns,
the conditions of the partial indexes and of the state constraint, and the helpers
that declare them (``dequeue_index()`` …)."""

from __future__ import annotations

from django.db import models

from .indexes import DequeueIndex, WaitingIndex, WholeIndex
from .states import DEQUEUEABLE_STATES, JobState

#: The predicate of the dequeue index: the rows a claim may take, not those that wait for
#: later (``process_after`` set: a worker clears it when they come due, see
#: ``runtime.stager``). The claim statement repeats it literally so PostgreSQL can prove
#: the partial index applies.
DEQUEUE_INDEX_CONDITION = models.Q(
    state__in=[s.value for s in DEQUEUEABLE_STATES], process_after__isnull=True
)
#: The predicate of the waiting index: queued or errored rows that wait for a time
#: (scheduled for later, or a retry's delay).
WAITING_INDEX_CONDITION = models.Q(
    state__in=[s.value for s in DEQUEUEABLE_STATES], process_after__isnull=False
)
#: The predicate of the processing index (``processing_index``, no longer declared).
PROCESSING_INDEX_CONDITION = models.Q(state=JobState.PROCESSING.value)
#: The predicate of the state index: every state but ``completed`` (where almost every
#: row ends, and which no statement looks up by state).
STATE_INDEX_CONDITION = models.Q(
    state__in=[s.value for s in JobState if s is not JobState.COMPLETED]
)
#: The condition of the check constraint on ``state``.
STATE_CONSTRAINT_CONDITION = models.Q(state__in=JobState.values)


#: The columns the worker owns (what ``WorkerJob`` declares besides ``id``).
BOOKKEEPING_FIELDS = (
    "state",
    "failure_message",
    "queued_at",
    "started_at",
    "finished_at",
    "process_after",
    "num_resets",
    "num_failures",
    "num_snoozes",
    "last_heartbeat_at",
    "execution_logs",
    "worker_hostname",
    "cancel",
    "progress",
    "history",
)


def dequeue_index(*fields: str, name: str) -> DequeueIndex:
    """A partial index over the rows a worker can still claim, in claim order.

    ``WorkerJob.Meta`` declares one on ``id``. A handler that claims in another
    order (``ordering = ("-priority", "id")``) should add one for that order::

        class Meta(WorkerJob.Meta):
            indexes = [
                *WorkerJob.Meta.indexes,
                dequeue_index("-priority", "id", name="myapp_job_prio_dq"),
            ]

    On MariaDB and MySQL, which have no partial indexes, it is created with the state
    first (``(state, -priority, id)``: ``indexes.DequeueIndex``).
    """
    return DequeueIndex(fields=list(fields), condition=DEQUEUE_INDEX_CONDITION, name=name)


def fair_index(field: str, *ordering: str, name: str) -> DequeueIndex:
    """The index a handler with ``fair_by = field`` claims through: over the rows a
    worker can still claim, by ``field`` then in the handler's ``ordering`` (default
    ``id``). A fair claim finds each key's first claimable rows there, one probe per
    key (docs/flow-control.md § Fair claims)::

        class Meta(WorkerJob.Meta):
            indexes = [*WorkerJob.Meta.indexes, fair_index("tenant", name="myapp_job_fair")]

    On MariaDB and MySQL it is ``(state, process_after, field, *ordering)``.
    """
    fields = [field, *(ordering or ("id",))]
    return DequeueIndex(fields=fields, condition=DEQUEUE_INDEX_CONDITION, name=name)


def waiting_index(*, name: str) -> WaitingIndex:
    """The partial index on ``process_after`` over the queued and errored rows that wait
    for a time: scheduled for later, or waiting for a retry's delay. Those rows stay out
    of the dequeue index, so a claim never reads them however many there are; a worker
    finds the next one due here and, when it comes due, releases it into the dequeue
    index (``runtime.stager``). ``WorkerJob.Meta`` declares it; a ``Meta`` that sets
    ``indexes`` without ``*WorkerJob.Meta.indexes`` should add it back.

    On MariaDB and MySQL, which have no partial indexes, it is ``(state,
    process_after)``: with the key InnoDB keeps after it, the claims in key order read
    it too (``indexes.WaitingIndex``).
    """
    return WaitingIndex(fields=["process_after"], condition=WAITING_INDEX_CONDITION, name=name)


def processing_index(*, name: str) -> models.Index:
    """The partial index on ``id`` over the rows being processed.

    ``WorkerJob.Meta`` declared it before: the state index (``state_index``) serves
    the same scans (the resetter's, the limits' counts), so it is no longer declared,
    and every claim writes one index entry fewer (docs/upgrading.md). A ``Meta`` that
    lists it keeps it; remove it there to drop the index.
    """
    return WholeIndex(fields=["id"], condition=PROCESSING_INDEX_CONDITION, name=name)


def state_index(*, name: str) -> models.Index:
    """The partial index on ``state`` over every row but the completed ones: the jobs
    per state the admin, ``dbworker_status`` and metrics count exactly (queued,
    processing, errored), the operator's retry of failed and canceled jobs, the admin's
    state filter. Completed rows, nearly all of a table, stay out of it, so completing
    a job writes no entry to it (about a fifth of the WAL per job).

    ``WorkerJob.Meta`` declares it; a ``Meta`` that sets ``indexes`` without
    ``*WorkerJob.Meta.indexes`` should add it back (``state_index(name="myapp_job_st")``).
    On MariaDB and MySQL, which have no partial indexes, it covers every row.
    """
    return WholeIndex(fields=["state"], condition=STATE_INDEX_CONDITION, name=name)


def worker_index(*, name: str) -> models.Index:
    """The index on ``(worker_hostname, id)``: the jobs of one worker, newest first (the
    admin's worker filter on a large table). Not declared by ``WorkerJob.Meta``: every
    claim and outcome writes an entry to it (about 17 % of no-op throughput measured),
    so add it only where that filter matters more::

        class Meta(WorkerJob.Meta):
            indexes = [*WorkerJob.Meta.indexes, worker_index(name="myapp_job_worker")]
    """
    return models.Index(fields=["worker_hostname", "id"], name=name)


def state_constraint(*, name: str) -> models.CheckConstraint:
    """The check constraint that keeps ``state`` one of ``JobState``'s values (declared
    by ``WorkerJob.Meta``; add it back to a ``Meta`` that sets ``constraints``)."""
    return models.CheckConstraint(condition=STATE_CONSTRAINT_CONDITION, name=name)
