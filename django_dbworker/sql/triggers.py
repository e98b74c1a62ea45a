"""Wake-ups for every producer: triggers on the job tables (PostgreSQL).

Rows inserted by code that is not this Django project (plain SQL from another
service, psql, a trigger on a domain table, ``COPY``) wake idle workers as the ORM
does, without the producer calling anything:

- ``AFTER INSERT ... FOR EACH STATEMENT``: one ``pg_notify`` per statement, however
  many rows it inserts (a bulk producer pays once per statement, not per row);
- ``AFTER UPDATE OF state, process_after ... FOR EACH ROW WHEN (...)``: an update
  that makes a row claimable now (``queued``/``errored`` with ``process_after`` due,
  from another state or another time). The condition is checked in C for each row
  the update touches; claims, heartbeats and outcomes never meet it (they set
  another state, or no such column), so the worker's own statements call nothing.

PostgreSQL folds identical notifications of one transaction into one, so the
ORM's own ``pg_notify`` beside a trigger costs nothing more. ``migrate`` installs
the triggers on every job table of the database it migrates (``post_migrate``),
and removes them with ``DBWORKER["NOTIFY"]`` or ``["NOTIFY_TRIGGERS"]`` off.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction
from django.db.models import Model

from .. import conf
from .notify import CHANNEL
from .tables import migrated

FUNCTION = "dbworker_notify"
INSERT_TRIGGER = "dbworker_notify_insert"
UPDATE_TRIGGER = "dbworker_notify_update"

CREATE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', TG_ARGV[0]);
    RETURN NULL;
END
$$
"""


def statements(model: type[Model], install: bool, quote: Any) -> list[str]:
    """What (re)creates the triggers of ``model``'s table, or (``install`` false)
    drops them. ``quote``: the connection's ``ops.quote_name``."""
    meta = model._meta
    table = quote(meta.db_table)
    name = meta.db_table.replace("'", "''")
    state, after = (quote(meta.get_field(name).column) for name in ("state", "process_after"))  # type: ignore[union-attr]
    drop = [
        f"DROP TRIGGER IF EXISTS {INSERT_TRIGGER} ON {table}",
        f"DROP TRIGGER IF EXISTS {UPDATE_TRIGGER} ON {table}",
    ]
    if not install:
        return drop
    return [
        *drop,
        f"CREATE TRIGGER {INSERT_TRIGGER} AFTER INSERT ON {table} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}('{name}')",
        f"CREATE TRIGGER {UPDATE_TRIGGER} AFTER UPDATE OF {state}, {after} ON {table} "
        f"FOR EACH ROW WHEN (NEW.{state} IN ('queued', 'errored') "
        f"AND (NEW.{after} IS NULL OR NEW.{after} <= now()) "
        f"AND (OLD.{state} IS DISTINCT FROM NEW.{state} "
        f"OR OLD.{after} IS DISTINCT FROM NEW.{after})) "
        f"EXECUTE FUNCTION {FUNCTION}('{name}')",
    ]


def wanted() -> bool:
    return bool(conf.get("NOTIFY")) and bool(conf.get("NOTIFY_TRIGGERS"))


def sync_triggers(models: Iterable[type[Model]], using: str = "default") -> list[str]:
    """Install (or remove, as the settings say) the triggers on the tables of the job
    ``models`` that exist in database ``using``; return the tables touched. Run by
    ``migrate`` (``post_migrate``) for every job model."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return []
    install = wanted()
    models = migrated(models, using)
    if not models:
        return []
    # One transaction: a producer never meets a table between the drop and the create.
    with transaction.atomic(using), connection.cursor() as cursor:
        if install:
            cursor.execute(CREATE_FUNCTION)
        for model in models:
            for sql in statements(model, install, connection.ops.quote_name):
                cursor.execute(sql)
    return [model._meta.db_table for model in models]
