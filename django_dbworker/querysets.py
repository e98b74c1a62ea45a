"""``WorkerJobQuerySet``: the job models' filters, enqueues that wake the workers, and
the operator's operations."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from itertools import islice
from typing import Any

from django.db import connections, models, transaction
from django.db.models.fields import AutoFieldMixin
from django.utils import timezone

from . import operations, signals
from .bulk import Rows
from .instances import Builder
from .job_meta import BOOKKEEPING_FIELDS
from .sql.dialects import dialect_for
from .sql.notify import notify_workers
from .states import FINAL_STATES, JobState


def _chunks(objs: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(objs)
    while chunk := list(islice(iterator, size)):
        yield chunk


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
