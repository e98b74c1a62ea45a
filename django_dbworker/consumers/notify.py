"""Wake-ups for consumers on PostgreSQL: a statement-level trigger that sends
``pg_notify('dbworker', <table>)`` after inserts into a consumed table, so rows
inserted by any program (plain SQL too) wake the consumers at commit. Consumers poll
anyway (``poll_interval``); this only makes them prompt.

In a migration of the app that owns the table::

    from django_dbworker.consumers.notify import notify_on_insert

    operations = [..., notify_on_insert("app_orderevent")]
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from ..sql.triggers import CREATE_FUNCTION, FUNCTION


def _sql(table: str, quote: Any) -> list[str]:
    """The job tables' notify function (``sql.triggers``), on an insert trigger."""
    trigger = quote(f"{table}_dbworker_notify")
    name = table.replace("'", "''")
    return [
        CREATE_FUNCTION,
        f"DROP TRIGGER IF EXISTS {trigger} ON {quote(table)}",
        f"CREATE TRIGGER {trigger} AFTER INSERT ON {quote(table)} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}('{name}')",
    ]


def notify_on_insert(table: str) -> migrations.RunPython:
    """A migration operation: the trigger on ``table`` (PostgreSQL; elsewhere nothing)."""

    def forward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        for statement in _sql(table, schema_editor.connection.ops.quote_name):
            schema_editor.execute(statement)

    def backward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        quote = schema_editor.connection.ops.quote_name
        schema_editor.execute(
            f"DROP TRIGGER IF EXISTS {quote(table + '_dbworker_notify')} ON {quote(table)}"
        )

    return migrations.RunPython(forward, backward, elidable=False)
