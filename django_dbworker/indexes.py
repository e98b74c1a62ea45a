"""The dequeue and waiting indexes where indexes take no WHERE (MariaDB, MySQL).

``dequeue_index()`` (``models``) is a partial index over the rows a claim may take now,
in claim order; ``waiting_index()`` one over the rows that wait for a time, by that
time. Django creates a partial index without its condition where the database has
none, which would make ``dequeue_index("-priority", "id")`` an index over every row in
priority order: a claim would walk it past every finished job. So there
``DequeueIndex`` puts the state and ``process_after`` first, ``(state, process_after,
-priority, id)``: a claim reads the rows of each state with no ``process_after``
(``sql.mysql_script``'s claims read each state apart) in claim order. ``WaitingIndex`` is
``(state, process_after)``, which, with the primary key InnoDB keeps after it, also
serves the claims in key order: an index on the primary key alone
(``dequeue_index("id")``) is left as it is.

Tables whose dequeue indexes were created otherwise need
``add_state_to_dequeue_indexes`` in a ``RunPython`` (docs/upgrading.md).
"""

from __future__ import annotations

from typing import Any

from django.db import NotSupportedError, migrations, models

#: The columns a dequeue index starts with where it has no condition.
STATE = "state"
LEADING = (STATE, "process_after")


class _Unconditional(models.Index):
    """An index equal to a ``models.Index`` with the same arguments (migrations written
    with either see no change), made as ``stated()`` where the database has no partial
    indexes."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, models.Index):
            return self.deconstruct()[1:] == other.deconstruct()[1:]
        return NotImplemented

    def stated(self, model: Any) -> list[str] | None:
        """The columns it is made of without its condition (None: as declared)."""
        raise NotImplementedError

    def without_condition(self, model: Any, connection: Any) -> models.Index | None:
        """The index this one is made as on ``connection`` when it cannot take the
        condition (None: as declared)."""
        if self.condition is None or connection.features.supports_partial_indexes:
            return None
        fields = self.stated(model)
        if fields is None:
            return None
        return models.Index(fields=fields, name=self.name, db_tablespace=self.db_tablespace)

    def check(self, model: Any, connection: Any) -> list[Any]:
        """Django's checks of the index (Django 6.1 has them here) without W037, "indexes
        with conditions are not supported": where the condition cannot be made, the
        index is made as ``stated()`` says instead of being ignored."""
        found = super().check(model, connection)
        return [message for message in found if message.id != "models.W037"]

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        stated = self.without_condition(model, schema_editor.connection)
        if stated is None:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        return stated.create_sql(model, schema_editor, using=using, **kwargs)


class WholeIndex(_Unconditional):
    """An index whose condition only keeps rows out of it (``state_index()``): where
    the database has no partial indexes it covers every row, as declared otherwise."""

    def stated(self, model: Any) -> list[str] | None:
        return None


class WaitingIndex(_Unconditional):
    """``waiting_index()``'s index: ``(state, process_after)`` where the database has no
    partial indexes."""

    def stated(self, model: Any) -> list[str] | None:
        return list(LEADING)


class DequeueIndex(_Unconditional):
    """``dequeue_index()``'s index: ``(state, process_after, *fields)`` where the database
    has no partial indexes; one on the primary key alone is left as it is (the waiting
    index serves those claims)."""

    def stated(self, model: Any) -> list[str] | None:
        if not self.fields or self._on_key(model):
            return None
        if [f.lstrip("-") for f in self.fields[: len(LEADING)]] == list(LEADING):
            return None
        return [*LEADING, *self.fields]

    def _on_key(self, model: Any) -> bool:
        pk = model._meta.pk
        return [f.lstrip("-") for f in self.fields] in ([pk.name], [pk.attname], ["pk"])


def add_state_to_dequeue_indexes(model: Any, schema_editor: Any) -> list[str]:
    """Where indexes take no condition, make the dequeue indexes of ``model`` that were
    created otherwise again, as ``DequeueIndex`` makes them (state and
    ``process_after`` first). For a
    ``RunPython`` (``model`` may be a migration's historical model, whose indexes are
    ``models.Index``); the names of those made again."""
    connection = schema_editor.connection
    if connection.features.supports_partial_indexes:
        return []
    from .models import DEQUEUE_INDEX_CONDITION

    table = model._meta.db_table
    with connection.cursor() as cursor:
        present = connection.introspection.get_constraints(cursor, table)
    made = []
    for declared in model._meta.indexes:
        if declared.condition != DEQUEUE_INDEX_CONDITION or declared.name not in present:
            continue
        index = DequeueIndex(
            fields=list(declared.fields),
            condition=declared.condition,
            name=declared.name,
            db_tablespace=declared.db_tablespace,
        )
        stated = index.without_condition(model, connection)
        if stated is None:
            continue
        meta = model._meta
        wanted = [
            meta.pk.column if f.lstrip("-") == "pk" else meta.get_field(f.lstrip("-")).column
            for f in stated.fields
        ]
        if present[declared.name]["columns"] == wanted:
            continue
        schema_editor.remove_index(model, declared)
        schema_editor.add_index(model, index)
        made.append(declared.name)
    return made


# -- changing the indexes of a job table in use ----------------------------------------


def _concurrently(schema_editor: Any, operation: str) -> bool:
    """Whether to build or drop concurrently: on PostgreSQL, outside a transaction."""
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return False
    if connection.in_atomic_block:
        raise NotSupportedError(
            f"{operation} cannot run inside a transaction: set atomic = False on the migration."
        )
    return True


class AddIndexConcurrently(migrations.AddIndex):
    """``AddIndex`` that lets claims and inserts go on while PostgreSQL builds the index
    (``CREATE INDEX CONCURRENTLY``: the migration needs ``atomic = False``); a plain
    ``AddIndex`` on the other databases. For upgrades of large job tables
    (docs/upgrading.md)."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not _concurrently(schema_editor, "AddIndexConcurrently"):
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)
        return None

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not _concurrently(schema_editor, "AddIndexConcurrently"):
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)
        return None


class RemoveIndexConcurrently(migrations.RemoveIndex):
    """``RemoveIndex`` that does not wait for, nor hold up, the statements using the table
    (PostgreSQL: ``DROP INDEX CONCURRENTLY``; the migration needs ``atomic = False``); a
    plain ``RemoveIndex`` on the other databases."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not _concurrently(schema_editor, "RemoveIndexConcurrently"):
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            schema_editor.remove_index(model, index, concurrently=True)
        return None

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not _concurrently(schema_editor, "RemoveIndexConcurrently"):
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            schema_editor.add_index(model, index, concurrently=True)
        return None
