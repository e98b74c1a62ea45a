"""The abstract ``WorkerJob`` every job table subclasses, and the worker registry."""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from itertools import islice
from typing import Any, Self

from django.db import connections, models, transaction
from django.db.backends.utils import names_digest
from django.db.models.fields import AutoFieldMixin
from django.db.models.functions import Now
from django.db.models.signals import class_prepared
from django.utils import timezone

from . import operations, signals
from .bulk import Rows
from .consumers.models import ConsumerCheckpoint, ConsumerGapSkip
from .control.models import AuditEntry, Pause, Schedule, ScheduleTick
from .indexes import DequeueIndex, WaitingIndex, WholeIndex
from .instances import Builder
from .sql.dialects import dialect_for
from .sql.notify import notify_workers
from .states import DEQUEUEABLE_STATES, FINAL_STATES, JobState
from .stats import JobStats

__all__ = [
    "AuditEntry",
    "ConsumerCheckpoint",
    "ConsumerGapSkip",
    "JobState",
    "JobStats",
    "Pause",
    "Schedule",
    "ScheduleTick",
    "WorkerJob",
    "WorkerJobQuerySet",
    "WorkerProcess",
    "dequeue_index",
    "fair_index",
    "processing_index",
    "state_constraint",
    "state_index",
    "waiting_index",
    "worker_index",
]

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


@functools.cache
def _domain_fields(model: type[models.Model]) -> list[tuple[str, str]]:
    """(name, attname) of the columns ``save()`` writes for an existing job: all but the
    worker's and the key."""
    return [
        (f.name, f.attname)
        for f in model._meta.concrete_fields
        if not f.primary_key
        and f.name not in BOOKKEEPING_FIELDS
        # The partition key of a partitioned table (``partitions.FinishedOnField``).
        and not getattr(f, "dbworker_partition_key", False)
    ]


def _chunks(objs: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(objs)
    while chunk := list(islice(iterator, size)):
        yield chunk


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


class WorkerJobQuerySet(models.QuerySet[Any]):
    """Filters and the operator's operations.

    Every operation is one guarded UPDATE (``django_dbworker.operations``): it only
    touches rows in the states it applies to, so it never races a worker into an
    inconsistent row.
    """

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Any]:
        """``QuerySet.bulk_create`` that also wakes the workers (on PostgreSQL)."""
        created = super().bulk_create(objs, *args, **kwargs)
        if created:
            notify_workers(self.model, self.db)
            if signals.jobs_enqueued.receivers:
                queued = [job for job in created if job.state == JobState.QUEUED]
                signals.send(signals.jobs_enqueued, self.model, jobs=queued, using=self.db)
        return created

    def bulk_enqueue(
        self, objs: Iterable[Any | Mapping[str, Any]], *, batch_size: int = 10_000
    ) -> int:
        """Enqueue many jobs fast; return how many.

        Each job is an instance, or a mapping of its field values (``{"tenant": 3}``,
        what ``Model(**values)`` takes): the instance is then made without Django's
        constructor where the model allows (``instances.Builder``), several times
        faster. Writes each job's own (domain) fields and ``process_after`` as ``save()``
        would (``auto_now_add``, defaults and ``db_default`` included); every
        bookkeeping column takes its database default (``queued``, queued now; on
        MariaDB ``queued_at`` is the database's UTC clock, whatever the session's
        time zone).
        Auto-increment primary keys are not set on ``objs``: use ``bulk_create``
        when you need them. On PostgreSQL this is one ``COPY`` per ``batch_size``
        jobs (several times faster than ``bulk_create``); elsewhere one prepared
        ``INSERT`` for many rows (``executemany``: MariaDB's driver sends them as
        multi-row statements). Wakes the workers like ``bulk_create``. A unique key
        (``unique_job_constraint``) held by an active job, or given twice, raises
        ``IntegrityError`` on every database, and no job of the batch is made
        (``enqueue_unique`` skips held keys one job at a time).
        """
        self._for_write = True  # self.db: the router's database for writes (bulk_create's)
        model = self.model
        meta = model._meta
        auto_pk = isinstance(meta.pk, AutoFieldMixin)
        fields = [
            f
            for f in meta.concrete_fields
            if (not f.primary_key or not auto_pk)
            and (f.name == "process_after" or f.name not in BOOKKEEPING_FIELDS)
        ]
        connection = connections[self.db]
        count = 0
        table = connection.ops.quote_name(meta.db_table)
        # MariaDB: queued_at from the workers' clock, in UTC. The column's default is
        # CURRENT_TIMESTAMP, in the session's time zone: a project's '+05:00' would
        # queue the jobs five hours from now.
        clock: list[tuple[str, str]] = []
        if connection.vendor == "mysql":
            queued_at = connection.ops.quote_name(meta.get_field("queued_at").column)
            clock.append((queued_at, dialect_for(connection).now))
        builder = Builder(model)
        prepare = Rows(fields, connection)
        objs = (o if isinstance(o, models.Model) else builder.build(o) for o in objs)
        with transaction.atomic(using=self.db, savepoint=False), connection.cursor() as cursor:
            for chunk in _chunks(objs, batch_size):
                # Rows by the columns they leave to the database (db_default): one write
                # of each group.
                groups: dict[tuple[Any, ...], list[list[Any]]] = {}
                for obj in chunk:
                    used, row = prepare.of(obj)
                    groups.setdefault(used, []).append(row)
                for columns_used, rows in groups.items():
                    columns = ", ".join(connection.ops.quote_name(f.column) for f in columns_used)
                    # The raw cursor's errors as Django's (IntegrityError on a held
                    # unique key, as bulk_create raises).
                    with connection.wrap_database_errors:
                        if connection.vendor == "postgresql":
                            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                                for row in rows:
                                    copy.write_row(row)
                        else:  # MySQLdb sends one multi-row INSERT per packet
                            names = [connection.ops.quote_name(f.column) for f in columns_used]
                            values = ["%s"] * len(columns_used)
                            names += [name for name, _ in clock]
                            values += [value for _, value in clock]
                            cursor.executemany(
                                f"INSERT INTO {table} ({', '.join(names)}) "
                                f"VALUES ({', '.join(values)})",
                                rows,
                            )
                count += len(chunk)
                signals.send(signals.jobs_enqueued, model, jobs=chunk, using=self.db)
            if count:
                notify_workers(model, self.db)
        return count

    def enqueue_unique(self, *, on_conflict: str = "skip", **fields: Any) -> tuple[Any, bool]:
        """Enqueue a job unless an active one holds its key: ``(job, created)``.

        The key is the fields of the model's unique constraints
        (``unique_job_constraint()``); the database enforces them. When a job holds the
        key: ``on_conflict="skip"`` returns that job untouched; ``"replace"`` first
        writes the other ``fields`` to it if it is still waiting (queued or errored;
        a running job is left alone), fields of another unique constraint too: when
        that would take a key another job holds, ``IntegrityError`` says so and
        nothing is written. Works inside a transaction (a savepoint).
        """
        from .control.unique import enqueue_unique

        return enqueue_unique(self.model, fields, on_conflict)

    def with_state(self, *states: str) -> WorkerJobQuerySet:
        return self.filter(state__in=states)

    def unfinished(self) -> WorkerJobQuerySet:
        return self.exclude(state__in=FINAL_STATES)

    def stalled(self, max_age: timedelta) -> WorkerJobQuerySet:
        """Processing rows whose heartbeat is older than ``max_age`` (what the resetter takes)."""
        cutoff = timezone.now() - max_age
        return self.filter(state=JobState.PROCESSING).filter(
            models.Q(last_heartbeat_at__isnull=True) | models.Q(last_heartbeat_at__lt=cutoff)
        )

    # The operator's operations: thin delegates to ``django_dbworker.operations``, which
    # takes any queryset (the admin calls it, so a default manager of your own works).

    def cancel(self) -> tuple[int, int]:
        """Cancel: queued/errored jobs become ``canceled`` now; processing jobs get the
        ``cancel`` flag and stop at their worker's next heartbeat.

        Returns (canceled now, cancellation requested). See ``operations.cancel``.
        """
        result = operations.cancel(self)
        return len(result.canceled), len(result.requested)

    def retry(self, *, reset_counters: bool = False) -> int:
        """Queue failed, errored and canceled jobs again, to run now; return how many.

        Counters are kept by default: a job past its retry budget then gets one
        more attempt. ``reset_counters=True`` zeroes ``num_failures``,
        ``num_resets`` and ``num_snoozes``, giving it its whole budget again. A job whose unique key
        another active job holds stays as it is (not counted):
        ``operations.retry(queryset).held`` says which, and which job holds each key.
        """
        return len(operations.retry(self, reset_counters=reset_counters).retried)

    def run_now(self) -> int:
        """Queued or errored jobs scheduled for later become claimable now; return how many."""
        return len(operations.run_now(self))

    def schedule(self, when: datetime.datetime) -> int:
        """Queued or errored jobs are not claimed before ``when``; return how many."""
        return len(operations.schedule(self, when))


class WorkerJob(models.Model):
    """A row of a job table. Subclass it and add your own domain columns.

    Every bookkeeping column also has a database default, so programs that
    enqueue with plain SQL (``INSERT INTO … (domain columns) VALUES …``) get
    valid rows too.
    """

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(
        max_length=16,
        choices=JobState.choices,
        default=JobState.QUEUED,
        db_default=JobState.QUEUED.value,
    )
    failure_message = models.TextField(null=True, blank=True)  # noqa: DJ001 - NULL means "no failure"
    queued_at = models.DateTimeField(default=timezone.now, db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    process_after = models.DateTimeField(
        null=True, blank=True, help_text="The job is not claimed before this time."
    )
    num_resets = models.PositiveIntegerField(default=0, db_default=0)
    num_failures = models.PositiveIntegerField(default=0, db_default=0)
    num_snoozes = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Times a handler snoozed the job (raise Snooze): not failures.",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    execution_logs = models.JSONField(default=list, db_default=models.Value("[]"), blank=True)
    worker_hostname = models.CharField(max_length=255, default="", db_default="", blank=True)
    cancel = models.BooleanField(default=False, db_default=False)
    progress = models.JSONField(
        null=True,
        blank=True,
        help_text="The running attempt's last check-in: text, done, total, at.",
    )
    history = models.JSONField(
        default=list,
        db_default=models.Value("[]"),
        blank=True,
        help_text="The attempts that ended without completing (errored, failed, canceled, "
        "requeued, reset), oldest first: worker, times, outcome, failure, log summary.",
    )

    objects = WorkerJobQuerySet.as_manager()

    class Meta:
        abstract = True
        indexes = [
            # Rows a worker can claim now, in the default claim order.
            dequeue_index("id", name="%(app_label)s_%(class)s_dq"),
            # Rows that wait for a time, by that time: the next one due.
            waiting_index(name="%(app_label)s_%(class)s_wt"),
            # Every row but the completed ones, by state: exact counts of active jobs,
            # and the rows being processed, which the resetter and limits scan.
            state_index(name="%(app_label)s_%(class)s_st"),
        ]
        constraints = [state_constraint(name="%(app_label)s_%(class)s_state_valid")]

    def __str__(self) -> str:
        return f"{type(self).__name__} {self.pk} ({self.state})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save the job; a new queued job also wakes the workers (PostgreSQL, at commit).

        For a job that exists already, only your own (domain) columns are written
        unless ``update_fields`` names others: the worker owns the bookkeeping
        columns (state, heartbeat, cancel flag, counters, execution log, times) of a
        job while it runs, and a ``job.save()`` in a handler or in the admin must not
        write back what was loaded earlier (a stale heartbeat gets a live job reset,
        a stale ``cancel`` undoes a cancellation). It is an UPDATE only, so it never
        re-inserts a job that was deleted meanwhile (Django raises instead).
        """
        if args:
            raise TypeError("WorkerJob.save() takes keyword arguments only")
        adding = self._state.adding or kwargs.get("force_insert")
        if not adding and kwargs.get("update_fields") is None:
            deferred = self.get_deferred_fields()
            kwargs["update_fields"] = [
                name for name, attname in _domain_fields(type(self)) if attname not in deferred
            ]
            kwargs.pop("force_update", None)
        super().save(**kwargs)
        update_fields = kwargs.get("update_fields")
        written = adding or (update_fields is not None and "state" in update_fields)
        if written and self.state == JobState.QUEUED:
            notify_workers(type(self), kwargs.get("using") or self._state.db)
            if adding:
                signals.send(signals.jobs_enqueued, type(self), jobs=[self], using=self._state.db)

    def wait(self, timeout: float | None = None) -> Self:
        """Block until the job is completed, failed or canceled, then return it
        reloaded (``refresh_from_db()``). ``django_dbworker.WaitTimeout`` (a
        ``TimeoutError``) past ``timeout`` seconds; ``DoesNotExist`` if the job was
        deleted. Every waiter of the process shares one connection (the hub of
        ``django_dbworker.waiting``): on PostgreSQL the outcome's NOTIFY wakes it,
        elsewhere it polls. See docs/results.md."""
        from .waiting import deadline_of, remaining, wait_for

        deadline = deadline_of(timeout)
        while True:
            wait_for(self, remaining(deadline), timeout)
            self.refresh_from_db()
            if self.state in FINAL_STATES:  # else retried meanwhile: wait on
                return self

    async def await_done(self, timeout: float | None = None) -> Self:
        """``wait()`` for coroutines: ``await job.await_done(timeout)`` never blocks the
        event loop, however many coroutines wait."""
        from .waiting import await_for, deadline_of, remaining

        deadline = deadline_of(timeout)
        while True:
            await await_for(self, remaining(deadline), timeout)
            await self.arefresh_from_db()
            if self.state in FINAL_STATES:  # else retried meanwhile: wait on
                return self

    @classmethod
    def notify_workers(cls, using: str | None = None) -> None:
        """Wake idle workers of this table now: call after enqueueing with plain SQL."""
        notify_workers(cls, using)


#: Longest name a constraint ``WorkerJob.Meta`` declares may keep: PostgreSQL cuts
#: identifiers at 63 bytes (Django's own limit of 30 is for indexes only).
MAX_CONSTRAINT_NAME_LENGTH = 63


def short_name(model: type[models.Model], suffix: str, limit: int) -> str:
    """A name of at most ``limit`` characters for the index or constraint ``suffix``
    of ``model``: ``<app_label>_<model>`` cut to fit, a hash of the model's label
    (stable, and unique per model), then the suffix. E.g. for
    ``myapp.RepositoryIndexingJob`` and ``_dq``: ``myapp_repositoryin_9ec50890_dq``.
    """
    digest = names_digest(model._meta.label_lower, length=8)
    prefix = f"{model._meta.app_label.lower()}_{model._meta.model_name}"
    return f"{prefix[: limit - len(suffix) - len(digest) - 1]}_{digest}{suffix}"


def _shorten_long_names(sender: type[models.Model], **kwargs: Any) -> None:
    """Give the indexes and constraint ``WorkerJob.Meta`` declares a short name on
    models whose ``%(app_label)s_%(class)s_…`` name is too long (Django refuses
    index names over 30 characters, models.E034). Names that fit are kept exactly,
    so existing migrations do not change."""
    if not issubclass(sender, WorkerJob) or sender._meta.abstract:
        return
    names = {"app_label": sender._meta.app_label.lower(), "class": sender._meta.model_name}
    declared: list[tuple[Sequence[Any], Sequence[Any], int]] = [
        (sender._meta.indexes, WorkerJob.Meta.indexes, models.Index.max_name_length),
        (sender._meta.constraints, WorkerJob.Meta.constraints, MAX_CONSTRAINT_NAME_LENGTH),
    ]
    for objs, templates, limit in declared:
        for template in templates:
            name = template.name % names
            if len(name) <= limit:
                continue
            suffix = template.name.rpartition("%(class)s")[2]
            for obj in objs:
                if obj.name == name:
                    obj.name = short_name(sender, suffix, limit)


class_prepared.connect(_shorten_long_names)


class WorkerProcess(models.Model):
    """A running ``runworker`` process, as it last reported itself.

    Written by the worker: a row at start, refreshed at every heartbeat,
    removed on a clean exit. Rows of workers that died stop moving; the
    resetter deletes them after ``DBWORKER["WORKER_RETENTION"]``.
    """

    worker_id = models.CharField(
        max_length=255, unique=True, help_text="Written to worker_hostname of the jobs it holds."
    )
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    handlers = models.JSONField(default=list)
    num_handlers = models.PositiveIntegerField(
        default=0,
        help_text="Handler threads of the process (with a shared pool: its size).",
    )
    threads = models.JSONField(
        default=dict,
        db_default=models.Value("{}"),
        help_text="Per handler it runs: its threads (in a shared pool: the slots it may "
        "take, its ceiling).",
    )
    jobs = models.JSONField(default=list, help_text="Jobs in flight, as app_label.model:id.")
    num_jobs = models.PositiveIntegerField(default=0)
    num_connections = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Database connections the process held open at its last heartbeat: its "
        "own, the listener's, and those of its handler threads (Django's pools at their size).",
    )
    heartbeat_interval = models.FloatField(
        default=1.0, help_text="Seconds between the worker's heartbeats."
    )
    pool = models.JSONField(
        null=True,
        blank=True,
        help_text="A shared pool's size and busy slots, and per handler its weight, "
        "ceiling, busy slots and share of the jobs of the last minutes (runworker --pool).",
    )
    tables = models.JSONField(
        default=dict,
        db_default=models.Value("{}"),
        help_text="Per job model it serves: [stalled_max_age, max_num_resets] of its jobs, "
        "which every resetter applies to the jobs this worker holds.",
    )
    started_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()

    class Meta:
        verbose_name = "worker process"
        verbose_name_plural = "worker processes"
        ordering = ["hostname", "pid"]
        permissions = [
            (
                "view_metrics",
                "Can read the Prometheus metrics (metrics_view: every job model's gauges)",
            )
        ]

    def __str__(self) -> str:
        return self.worker_id

    def seconds_since_heartbeat(self) -> float:
        return (timezone.now() - self.last_heartbeat_at).total_seconds()

    def is_alive(self) -> bool:
        """Heard from within five heartbeat intervals (and at least 10 s)."""
        return self.seconds_since_heartbeat() < max(5 * self.heartbeat_interval, 10.0)


def job_models() -> list[type[WorkerJob]]:
    """Every concrete job model (subclass of ``WorkerJob``) of the project."""
    from django.apps import apps

    return [
        model
        for model in apps.get_models()
        if issubclass(model, WorkerJob) and not model._meta.proxy
    ]
