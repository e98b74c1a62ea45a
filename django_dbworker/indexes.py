"""The dequeue index where indexes take no WHERE (MariaDB, MySQL).

``dequeue_index()`` (``models``) is a partial index over the claimable rows in claim
order. Django creates a partial index without its condition where the database has
none, which would make ``dequeue_index("-priority", "id")`` an index over every row
in priority order: a claim would walk it past every finished job. ``DequeueIndex``
puts the state first there instead, ``(state, -priority, id)``, so a claim reads the
claimable rows of each state in claim order (``sql.mysql``'s claims read each state
apart). An index on the primary key alone is left as it is: InnoDB's index on
``state`` already holds the key after the state.

Tables whose dequeue indexes were created without the state need
``add_state_to_dequeue_indexes`` in a ``RunPython`` (docs/upgrading.md).
"""

from __future__ import annotations

from typing import Any

from django.db import models

#: The column a dequeue index starts with where it has no condition.
STATE = "state"


class DequeueIndex(models.Index):
    """``dequeue_index()``'s index: equal to a ``models.Index`` with the same arguments
    (migrations written with either see no change); where the database has no partial
    indexes it is created as ``(state, *fields)``."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, models.Index):
            return self.deconstruct()[1:] == other.deconstruct()[1:]
        return NotImplemented

    def without_condition(self, model: Any, connection: Any) -> models.Index | None:
        """The index this one is made as on ``connection`` when it cannot take the
        condition and does not start with the state already (None: as declared)."""
        if self.condition is None or connection.features.supports_partial_indexes:
            return None
        if not self.fields or self.fields[0].lstrip("-") == STATE or self._on_key(model):
            return None
        return models.Index(
            fields=[STATE, *self.fields], name=self.name, db_tablespace=self.db_tablespace
        )

    def _on_key(self, model: Any) -> bool:
        pk = model._meta.pk
        return [f.lstrip("-") for f in self.fields] in ([pk.name], [pk.attname], ["pk"])

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        stated = self.without_condition(model, schema_editor.connection)
        if stated is None:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        return stated.create_sql(model, schema_editor, using=using, **kwargs)


def add_state_to_dequeue_indexes(model: Any, schema_editor: Any) -> list[str]:
    """Where indexes take no condition, make the dequeue indexes of ``model`` that were
    created without the state again, state first (``DequeueIndex``). For a
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
        columns = present[declared.name]["columns"]
        if stated is None or (columns and columns[0] == model._meta.get_field(STATE).column):
            continue
        schema_editor.remove_index(model, declared)
        schema_editor.add_index(model, index)
        made.append(declared.name)
    return made
