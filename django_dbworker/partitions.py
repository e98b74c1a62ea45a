"""Partitioned job tables (PostgreSQL): finished jobs kept in one partition per day, which
retention drops whole instead of deleting rows.

Opt in per job model::

    from django_dbworker.partitions import PartitionedWorkerJob

    class EventJob(PartitionedWorkerJob):  # a WorkerJob with ``finished_on``
        ...

and make its table partitioned in a migration, after the one that creates it::

    from django_dbworker.partitions import PartitionJobTable

    operations = [PartitionJobTable("eventjob")]

``finished_on`` is the partition key: ``ACTIVE_DAY`` (9999-12-31) while the job is
queued, processing or errored, the UTC day it finished on once it is completed, failed
or canceled (the worker's statements and the operator's operations write it; the
``save()`` of a new job computes it). docs/operations.md § Partitioned job tables.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.db import migrations, models

from .models import WorkerJob
from .sql import partitions as sql
from .sql.partitions import ACTIVE_DAY, KEY, day_of, is_partitioned_model

__all__ = [
    "ACTIVE_DAY",
    "FinishedOnField",
    "PartitionJobTable",
    "PartitionedWorkerJob",
    "is_partitioned_model",
]

#: Days after today whose partitions a conversion and each maintenance pass make ahead.
AHEAD = 3


class FinishedOnField(models.DateField):  # type: ignore[type-arg]
    """The partition key of a partitioned job table: the UTC day a finished job finished
    on, ``ACTIVE_DAY`` while it is not finished. The worker writes it; not editable."""

    dbworker_partition_key = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", ACTIVE_DAY)
        kwargs.setdefault("db_default", ACTIVE_DAY)
        kwargs.setdefault("editable", False)
        kwargs.setdefault("db_index", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        for key, value in (("default", ACTIVE_DAY), ("db_default", ACTIVE_DAY)):
            if kwargs.get(key) == value:
                del kwargs[key]
        if kwargs.get("editable") is False:
            del kwargs["editable"]
        return name, path, args, kwargs

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        """A new job goes to its day's partition if it is created finished (a fixture,
        an import), to the active partition otherwise."""
        if add:
            state = str(getattr(model_instance, "state", "") or "")
            finished = getattr(model_instance, "finished_at", None)
            setattr(model_instance, self.attname, day_of(finished, state))
        return super().pre_save(model_instance, add)


class PartitionedWorkerJob(WorkerJob):
    """``WorkerJob`` with the partition key ``finished_on``: subclass it for a job table
    that ``PartitionJobTable`` makes partitioned (PostgreSQL)."""

    finished_on = FinishedOnField()

    class Meta(WorkerJob.Meta):
        abstract = True


class PartitionJobTable(migrations.operations.base.Operation):
    """Make the table of job model ``model_name`` (which has ``finished_on``) partitioned
    by ``finished_on`` on PostgreSQL; nothing on the other databases (where the model
    stays an ordinary table: the system check dbworker.E034 refuses its handlers).

    On an existing table, in the migration's transaction, with the table locked: its
    active jobs move to the active partition, its finished jobs stay where they are,
    as the legacy partition, which retention empties row by row and then drops
    (PostgreSQL scans it once to attach it, and builds the table's indexes on it).
    Going back copies every row into an ordinary table again.
    """

    reversible = True
    reduces_to_sql = False

    def __init__(self, model_name: str, ahead: int = AHEAD) -> None:
        self.model_name = model_name
        self.ahead = ahead

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"model_name": self.model_name}
        if self.ahead != AHEAD:
            kwargs["ahead"] = self.ahead
        return type(self).__qualname__, [], kwargs

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def describe(self) -> str:
        return f"Partition the job table of {self.model_name} by finished_on"

    @property
    def migration_name_fragment(self) -> str:
        return f"partition_{self.model_name.lower()}"

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        connection = schema_editor.connection
        if connection.vendor != "postgresql" or not self.allow_migrate_model(
            connection.alias, model
        ):
            return
        partition_table(model, schema_editor, self.ahead)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        connection = schema_editor.connection
        if connection.vendor != "postgresql" or not self.allow_migrate_model(
            connection.alias, model
        ):
            return
        unpartition_table(model, schema_editor)


def _drop_keys_and_indexes(model: Any, schema_editor: Any, cursor: Any) -> None:
    """Drop the primary key, unique constraints and indexes of ``model``'s table (their
    names pass to the partitioned table); check and foreign key constraints stay."""
    table = model._meta.db_table
    found = schema_editor.connection.introspection.get_constraints(cursor, table)
    q = schema_editor.quote_name
    for name, info in found.items():
        if info.get("check") or info.get("foreign_key"):
            continue
        if info.get("primary_key") or info.get("unique"):
            cursor.execute(f"ALTER TABLE {q(table)} DROP CONSTRAINT IF EXISTS {q(name)}")
        if info.get("index") or info.get("unique"):
            cursor.execute(f"DROP INDEX IF EXISTS {q(name)}")


def _add_indexes_and_constraints(model: Any, schema_editor: Any) -> None:
    for statement in schema_editor._model_indexes_sql(model):
        schema_editor.execute(statement)
    present = set()
    with schema_editor.connection.cursor() as cursor:
        present = set(
            schema_editor.connection.introspection.get_constraints(cursor, model._meta.db_table)
        )
    for constraint in model._meta.constraints:
        if constraint.name not in present:
            schema_editor.add_constraint(model, constraint)
    for field in model._meta.local_concrete_fields:
        if field.remote_field and field.db_constraint:
            suffix = "_fk_%(to_table)s_%(to_column)s"
            schema_editor.execute(schema_editor._create_fk_sql(model, field, suffix))


def _run_deferred(schema_editor: Any, table: str) -> None:
    """Run now what the migration left for its end about ``table`` (a ``CreateModel``
    before this operation: its indexes, foreign keys), so that they are on the table
    this operation partitions, then made again on the partitioned one."""
    for statement in list(schema_editor.deferred_sql):
        if hasattr(statement, "references_table") and statement.references_table(table):
            schema_editor.execute(statement)
            schema_editor.deferred_sql.remove(statement)


def _name_active_keys(model: Any, cursor: Any) -> None:
    """Name the active partition's index of each unique key ``<key>_active``: what a
    violation names (PostgreSQL reports the partition's index)."""
    active = sql.partition_name(model._meta.db_table, "_active")
    for constraint in model._meta.constraints:
        if not isinstance(constraint, models.UniqueConstraint):
            continue
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_index x ON x.indexrelid = c.oid "
            "WHERE i.inhparent = to_regclass(%s) AND x.indrelid = to_regclass(%s)",
            [sql.quote(constraint.name), sql.quote(active)],
        )
        row = cursor.fetchone()
        if row:
            wanted = sql.partition_name(constraint.name, "_active")
            cursor.execute(f"ALTER INDEX {sql.quote(row[0])} RENAME TO {sql.quote(wanted)}")


def partition_table(model: Any, schema_editor: Any, ahead: int = AHEAD) -> bool:
    """Make ``model``'s table partitioned (see ``PartitionJobTable``); False if it was."""
    meta = model._meta
    table, pk = meta.db_table, meta.pk.column
    columns = [f.column for f in meta.local_concrete_fields]
    if KEY not in [f.name for f in meta.local_concrete_fields]:
        raise ValueError(f"{meta.label}: a partitioned job table needs the field {KEY!r}")
    _run_deferred(schema_editor, table)
    with schema_editor.connection.cursor() as cursor:
        if sql.is_partitioned(cursor, table):
            return False
        cursor.execute(f"LOCK TABLE {sql.quote(table)} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {sql.quote(table)})")
        has_rows = bool(cursor.fetchone()[0])
        _drop_keys_and_indexes(model, schema_editor, cursor)
        legacy = sql.partition_name(table, "_legacy")
        cursor.execute(f"ALTER TABLE {sql.quote(table)} RENAME TO {sql.quote(legacy)}")
        for statement in sql.convert_head(table, pk, columns, has_rows):
            cursor.execute(statement)
    _add_indexes_and_constraints(model, schema_editor)
    with schema_editor.connection.cursor() as cursor:
        _name_active_keys(model, cursor)
        for statement in sql.convert_tail(table, pk, has_rows):
            cursor.execute(statement)
        today = datetime.datetime.now(datetime.UTC).date()
        for day in sql.days_to_make(today, ahead):
            cursor.execute(sql.create_day(table, day))
    return True


def unpartition_table(model: Any, schema_editor: Any) -> bool:
    """Make ``model``'s partitioned table an ordinary one again (every row copied)."""
    meta = model._meta
    with schema_editor.connection.cursor() as cursor:
        if not sql.is_partitioned(cursor, meta.db_table):
            return False
        for statement in sql.unconvert(meta.db_table, meta.pk.column):
            cursor.execute(statement)
    _add_indexes_and_constraints(model, schema_editor)
    return True


def partition_problems(handler: Any, model: Any, name: str, cls: type) -> list[Any]:
    """A handler of a partitioned job table (E034: not on PostgreSQL; W011: its
    retention keeps some finished jobs for ever, so no day partition is ever dropped;
    E035: a unique key over every state, which partitions cannot hold)."""
    from django.core import checks
    from django.db import connections, router

    from .control.unique import UniqueJobConstraint
    from .states import FINAL_STATES

    if not is_partitioned_model(model):
        return []
    vendor = connections[router.db_for_write(model)].vendor
    if vendor != "postgresql":
        return [
            checks.Error(
                f"{name}: {model._meta.label} is a partitioned job table "
                f"(PartitionedWorkerJob), which only PostgreSQL has; its database is {vendor}.",
                hint="Subclass WorkerJob instead of PartitionedWorkerJob for this database, "
                "or keep this job model on PostgreSQL.",
                obj=cls,
                id="dbworker.E034",
            )
        ]
    problems: list[Any] = []
    kept = [str(s) for s in FINAL_STATES if str(s) not in {str(k) for k in handler.retention or {}}]
    if kept:
        problems.append(
            checks.Warning(
                f"{name}: retention keeps {', '.join(kept)} jobs for ever, so the day "
                f"partitions of {model._meta.label} are never dropped (each holds every "
                "finished job of its day): retention deletes their rows one batch at a time.",
                hint="Give retention an age for each of completed, failed and canceled.",
                obj=cls,
                id="dbworker.W011",
            )
        )
    for constraint in model._meta.constraints:
        if isinstance(constraint, UniqueJobConstraint) and constraint.condition is None:
            problems.append(
                checks.Error(
                    f"{name}: the unique key {constraint.name!r} of {model._meta.label} "
                    "holds over every state, which a partitioned table cannot enforce (a "
                    "unique index of a partitioned table holds within each day only).",
                    hint="Use unique_job_constraint() over the active states (its default): "
                    "every active job is in one partition.",
                    obj=cls,
                    id="dbworker.E035",
                )
            )
    return problems
