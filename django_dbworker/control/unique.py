"""Unique jobs: at most one active job per key, enforced by a unique constraint.

``unique_job_constraint()`` builds the constraint for a job model's ``Meta``;
``Model.objects.enqueue_unique()`` inserts under it. The database decides: the insert
runs in a savepoint, and a job that already holds the key makes it fail (on
PostgreSQL and MariaDB a concurrent insert of the same key waits for the other
transaction, then fails or goes through), so no read-then-write race can make two.
Where unique indexes take no WHERE (MariaDB), ``UniqueJobConstraint`` indexes a
generated column that holds the key only while the job is active.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from django.core import checks
from django.db import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    connections,
    models,
    router,
    transaction,
)
from django.db.backends.ddl_references import Statement, Table
from django.utils import timezone

from ..sql.dialects import Dialect, dialect_for
from ..sql.partitions import KEY, is_partitioned_model
from ..sql.waiting import condition_states, waiting_states
from ..states import JobState

#: The states in which a job holds its key by default: not finished yet.
ACTIVE_STATES = (JobState.QUEUED, JobState.PROCESSING, JobState.ERRORED)
#: The states a waiting-only key may be held in (``states=["queued"]`` or both).
WAITING_ONLY_STATES = (JobState.QUEUED, JobState.ERRORED)
SKIP, REPLACE = "skip", "replace"
#: Tries when the job holding the key finishes between the failed insert and the lookup
#: (with short jobs and many enqueuers that happens a few times in a row).
_TRIES = 100


def unique_job_constraint(
    *fields: str, name: str, states: Iterable[str] | None = ACTIVE_STATES
) -> models.UniqueConstraint:
    """A unique constraint over ``fields`` among the jobs in ``states`` (default: queued,
    processing, errored-awaiting-retry). ``states=None``: among all jobs, whatever
    their state (with a period field: "at most one per hour", see ``period_key``).

    ``states`` is either every active state (queued, processing and errored, maybe
    more), or a *waiting-only* key: queued, maybe errored, never processing (gocraft's
    unique jobs: a job lets go of its key when a worker takes it, so a change that
    comes while it runs is enqueued). The engine moves a job back to waiting without
    asking for its key (the resetter, a requeue at shutdown, a retry after an error):
    with a waiting-only key, a job that comes back while another job waits with its
    key is *superseded* by that job (it ends ``canceled``, its failure message naming
    the job that holds the key; ``sql.waiting``). Any other set is refused."""
    if states is not None:
        states = [str(s) for s in states]
        if not allowed_states(set(states)):
            raise ValueError(
                f"unique_job_constraint {name!r}: states {sorted(states)} are neither "
                "every active state (queued, processing and errored) nor a waiting-only "
                "key (queued, maybe errored, not processing): the engine moves jobs among "
                "these states without taking the key again"
            )
    condition = None if states is None else models.Q(state__in=states)
    return UniqueJobConstraint(fields=list(fields), condition=condition, name=name)


def allowed_states(states: set[str]) -> bool:
    """Whether a key held in ``states`` is one the engine can keep: held in every active
    state, or while waiting only (``WAITING_ONLY_STATES``)."""
    active = {str(s) for s in ACTIVE_STATES}
    waiting = {str(s) for s in WAITING_ONLY_STATES}
    return str(JobState.QUEUED) in states and (active <= states or states <= waiting)


class UniqueJobConstraint(models.UniqueConstraint):
    """``unique_job_constraint()``'s constraint: a ``UniqueConstraint`` (equal to one
    with the same arguments: migrations written with either see no change), which a
    database without partial indexes (MariaDB: ``Dialect.partial_unique``) gets as a
    generated column that holds (a digest of) the key only while the condition holds,
    under a unique index (``Dialect.add_unique_where``). Elsewhere it is Django's,
    unchanged."""

    def _without_partial_index(self, connection: Any) -> Dialect | None:
        """The dialect that has to emulate this constraint's condition, if any."""
        if self.condition is None:
            return None
        try:
            dialect = dialect_for(connection)
        except NotImplementedError:
            return None
        return None if dialect.partial_unique else dialect

    def _partitioned(self, model: Any, connection: Any) -> models.UniqueConstraint | None:
        """The constraint as a partitioned table takes it (PostgreSQL wants the partition
        key in it): ``finished_on`` added, which every active job shares
        (``sql.partitions.ACTIVE_DAY``), so the key still holds among them."""
        if connection.vendor != "postgresql" or not is_partitioned_model(model):
            return None
        if not self.fields or KEY in self.fields:
            return None
        return models.UniqueConstraint(
            fields=[*self.fields, KEY], condition=self.condition, name=self.name
        )

    def constraint_sql(self, model: Any, schema_editor: Any) -> Any:
        partitioned = self._partitioned(model, schema_editor.connection)
        if partitioned is not None:
            return partitioned.constraint_sql(model, schema_editor)
        if self._without_partial_index(schema_editor.connection) is None:
            return super().constraint_sql(model, schema_editor)
        # Not inside CREATE TABLE: an ALTER TABLE after it (as Django does for indexes).
        schema_editor.deferred_sql.append(self.create_sql(model, schema_editor))
        return None

    def create_sql(self, model: Any, schema_editor: Any) -> Any:
        partitioned = self._partitioned(model, schema_editor.connection)
        if partitioned is not None:
            return partitioned.create_sql(model, schema_editor)
        dialect = self._without_partial_index(schema_editor.connection)
        if dialect is None:
            return super().create_sql(model, schema_editor)
        columns = [model._meta.get_field(name).column for name in self.fields]
        condition = self._get_condition_sql(model, schema_editor)  # type: ignore[attr-defined]
        table = model._meta.db_table
        ddl = dialect.add_unique_where(table, self.name, columns, condition)
        return Statement("%(ddl)s", ddl=ddl, table=Table(table, schema_editor.quote_name))

    def remove_sql(self, model: Any, schema_editor: Any) -> Any:
        dialect = self._without_partial_index(schema_editor.connection)
        if dialect is None:
            return super().remove_sql(model, schema_editor)
        return dialect.drop_unique_where(model._meta.db_table, self.name)

    def check(self, model: Any, connection: Any) -> list[checks.CheckMessage]:
        # Django >= 6.0 asks each constraint; 5.2 warns in Model._check_constraints
        # instead, where this cannot say that the warning is a false alarm.
        parent = getattr(super(), "check", None)
        errors: list[checks.CheckMessage] = parent(model, connection) if parent else []
        if self._without_partial_index(connection) is not None:  # it is created
            errors = [e for e in errors if e.id != "models.W036"]
        return errors


def add_missing_unique_indexes(model: Any, schema_editor: Any) -> list[str]:
    """Create the conditional unique constraints of ``model`` (``unique_job_constraint``)
    that its table lacks, as ``UniqueJobConstraint``: on MariaDB, those a migration
    declared as ``models.UniqueConstraint(condition=…)``, for which Django creates
    nothing there. For a ``RunPython`` (``model`` may be a migration's historical
    model); the names of those created."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        present = connection.introspection.get_constraints(cursor, model._meta.db_table)
    added = []
    for found in unique_constraints(model):
        if found.condition is None or found.name in present:
            continue
        constraint = UniqueJobConstraint(
            fields=found.fields, condition=found.condition, name=found.name
        )
        schema_editor.add_constraint(model, constraint)
        added.append(found.name)
    return added


def period_key(period: datetime.timedelta, at: datetime.datetime | None = None) -> str:
    """The start of the ``period`` that ``at`` (default: now) falls in, as ISO text in
    UTC: the value of a period field of a unique key (one job per period)."""
    at = (at or timezone.now()).astimezone(datetime.UTC)
    step = int(period.total_seconds())
    if step <= 0:
        raise ValueError("period must be positive")
    start = int(at.timestamp()) // step * step
    return datetime.datetime.fromtimestamp(start, datetime.UTC).isoformat()


def enqueue_unique(
    model: type[models.Model], fields: dict[str, Any] | models.Model, on_conflict: str = SKIP
) -> tuple[Any, bool]:
    """See ``WorkerJobQuerySet.enqueue_unique``; ``fields`` may be the unsaved job."""
    if on_conflict not in (SKIP, REPLACE):
        raise ValueError(f"on_conflict={on_conflict!r}: use {SKIP!r} or {REPLACE!r}")
    alias = router.db_for_write(model)
    from ..support import refuse

    refuse(alias, "unique")  # dbworker.E033: a database without unique jobs
    constraints = _constraints(model)
    manager = model._base_manager.db_manager(alias)
    if isinstance(fields, models.Model):
        unsaved = fields
        fields = {f.attname: getattr(unsaved, f.attname) for f in model._meta.concrete_fields}
        fields.pop(model._meta.pk.attname)
    for _ in range(_TRIES):
        job = model(**fields)
        try:
            with transaction.atomic(using=alias):
                job.save(using=alias)
            return job, True
        except IntegrityError as exc:
            if not any(_is_from(exc, c, alias) for c in constraints):
                raise
            error: DatabaseError = exc
        except OperationalError as exc:  # MariaDB: inserters of one key deadlocked
            # That ended the whole transaction: run again only when it was ours alone.
            connection = connections[alias]
            if connection.in_atomic_block or not dialect_for(connection).deadlocked(exc):
                raise
            error = exc
            continue
        holder = _holder(manager, constraints, job)
        if holder is None:  # it finished meanwhile: insert again
            continue
        if (
            on_conflict == REPLACE
            and not _replace(manager, holder, fields, constraints, alias)
            and any(waiting_only(c) for c in _held(holder, fields, constraints))
        ):
            continue  # a worker took it before the write: its waiting-only key is free
        return holder, False
    raise error


def waiting_only(constraint: models.UniqueConstraint) -> frozenset[str] | None:
    """The states a waiting-only key (``unique_job_constraint(states=["queued"])``) is
    held in; None for any other constraint."""
    return waiting_states(constraint)


def _held(
    holder: Any, fields: dict[str, Any], constraints: list[models.UniqueConstraint]
) -> list[models.UniqueConstraint]:
    """The constraints whose key ``holder`` holds (in its state as it was read) with the
    values of ``fields``."""
    return [
        c
        for c in constraints
        if all(getattr(holder, n) == fields.get(n) for n in c.fields)
        and ((states := condition_states(c)) is None or str(holder.state) in states)
    ]


def _replace(
    manager: Any,
    holder: Any,
    fields: dict[str, Any],
    constraints: list[models.UniqueConstraint],
    alias: str,
) -> bool:
    """``on_conflict="replace"``: write ``fields`` to ``holder`` if it is still waiting
    (queued or errored; for a waiting-only key, in that key's states: still holding
    it). The key it holds is left as it is; a field of another unique constraint is
    written too, and when that would take a key another job holds, an
    ``IntegrityError`` names the constraint and the job, and nothing is written. False
    when ``holder`` no longer waits (nothing was written)."""
    held_by = _held(holder, fields, constraints)
    held = {name for c in held_by for name in c.fields}
    changes = {k: v for k, v in fields.items() if k not in held}
    if not changes:
        return True
    states = {str(JobState.QUEUED), str(JobState.ERRORED)}
    for constraint in held_by:
        states &= waiting_only(constraint) or states
    waiting = manager.filter(pk=holder.pk, state__in=sorted(states))
    try:
        with transaction.atomic(using=alias):
            written = waiting.update(**changes)
    except IntegrityError as exc:
        # The constraint whose new key another job holds (SQLite's error does not name
        # it, and may name another one's columns).
        for taken in (c for c in constraints if _is_from(exc, c, alias)):
            key = {name: changes.get(name, getattr(holder, name)) for name in taken.fields}
            other = _holder(manager, [taken], SimpleNamespace(pk=holder.pk, **key))
            if other is not None:
                raise IntegrityError(
                    f"enqueue_unique(on_conflict='replace'): writing "
                    f"{', '.join(sorted(set(changes) & set(taken.fields)))} to job "
                    f"{holder.pk} would take the key of {taken.name}, which job {other.pk} "
                    "holds; nothing was written"
                ) from exc
        raise
    if written:
        holder.refresh_from_db(using=alias)
    return bool(written)


def _holder(manager: Any, constraints: list[models.UniqueConstraint], job: Any) -> Any:
    """The job (other than ``job``) that holds one of the keys of ``job``, if any still
    does."""
    for constraint in constraints:
        key = {name: getattr(job, name) for name in constraint.fields}
        if any(value is None for value in key.values()):
            continue  # NULLs never conflict
        others = manager.filter(constraint.condition or models.Q(), **key)
        if job.pk is not None:
            others = others.exclude(pk=job.pk)
        holder = others.first()
        if holder is not None:
            return holder
    return None


def holder_of(job: models.Model, using: str) -> Any:
    """The active job that holds a unique key ``job`` needs, if any (what an operator's
    retry of ``job`` ran into)."""
    model = type(job)
    return _holder(model._base_manager.db_manager(using), unique_constraints(model), job)


def is_key_violation(exc: IntegrityError, model: type[models.Model]) -> bool:
    """Whether ``exc`` is a violation of one of the unique constraints of ``model``."""
    alias = router.db_for_write(model)
    return any(_is_from(exc, c, alias) for c in unique_constraints(model))


def unique_constraints(model: type[models.Model]) -> list[models.UniqueConstraint]:
    """The unique constraints (over fields) of ``model``, if any."""
    return [
        c for c in model._meta.constraints if isinstance(c, models.UniqueConstraint) and c.fields
    ]


def _constraints(model: type[models.Model]) -> list[models.UniqueConstraint]:
    """The unique constraints (over fields) of ``model``; a clear error without one."""
    found = unique_constraints(model)
    if not found:
        raise ValueError(
            f"{model._meta.label} has no unique constraint for enqueue_unique() to keep "
            "jobs unique by: add django_dbworker.unique_job_constraint(...) to its "
            "Meta.constraints (and run makemigrations)"
        )
    return found


def _is_from(
    exc: IntegrityError, constraint: models.UniqueConstraint, alias: str | None = None
) -> bool:
    """Whether ``exc`` is a violation of ``constraint`` (as far as the driver says)."""
    diag = getattr(exc.__cause__, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if name is not None:  # PostgreSQL names it (a partition's index: its own name)
        return bool(name == constraint.name) or _index_of(alias, name) == constraint.name
    message = str(exc.args[-1]) if exc.args else ""
    if message.startswith("Duplicate entry "):  # MariaDB/MySQL: "… for key 'name'"
        return message.endswith((f" for key '{constraint.name}'", f".{constraint.name}'"))
    return "UNIQUE constraint failed" in str(exc)  # SQLite: columns or index name


#: The index of a partitioned table each partition's index belongs to, per database.
_PARENTS: dict[tuple[str, str], str | None] = {}


def _index_of(alias: str | None, name: str) -> str | None:
    """The index of a partitioned table that index ``name`` is the partition's copy of
    (a unique key of a partitioned job table), or None; PostgreSQL only."""
    if alias is None or connections[alias].vendor != "postgresql":
        return None
    if (alias, name) not in _PARENTS:
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                cursor.execute(
                    "SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
                    "JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relname = %s "
                    "AND c.relkind = 'i'",
                    [name],
                )
                row = cursor.fetchone()
        except DatabaseError:
            return None
        _PARENTS[alias, name] = row[0] if row else None
    return _PARENTS[alias, name]
