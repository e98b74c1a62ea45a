"""What ``migrate`` keeps on every job table besides its columns (PostgreSQL): the
wake-up triggers (``sql.triggers``) and the fillfactor.

A claim and an outcome each write a new version of the job's row. They change
``state``, which the state index and the dequeue index's predicate read, so they are
never HOT updates. Where the row's page has room, the new version goes on that page:
PostgreSQL logs the bytes that changed, under one block reference. Where it has none
(a page INSERT or ``COPY`` filled to 100 %, PostgreSQL's default), the version goes to
another page: PostgreSQL logs the whole tuple, both pages, and a lock record that
marks the old version while it looks for room. ``DBWORKER["FILLFACTOR"]`` leaves the
room: the share of each page an INSERT fills. Page pruning frees the old versions,
so a drained table ends no larger than one filled to 100 %. Pages written before the
setting keep their fill until their rows move.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections, router
from django.db.models import Model

from .. import conf
from . import partitions


def migrated(models: Iterable[type[Model]], using: str) -> list[type[Model]]:
    """The job ``models`` whose tables exist in database ``using`` and are migrated
    there."""
    existing = set(connections[using].introspection.table_names())
    return [
        model
        for model in models
        if model._meta.db_table in existing and router.allow_migrate_model(using, model)
    ]


def fillfactor_of(cursor: Any, table: str) -> int:
    """The fillfactor of ``table`` (a quoted name), 100 when none is set."""
    cursor.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [table])
    for option in cursor.fetchone()[0] or []:
        name, _, value = option.partition("=")
        if name == "fillfactor":
            return int(value)
    return 100


def storage_table(cursor: Any, table: str) -> str:
    """The table whose pages hold ``table``'s active rows: itself, or the active
    partition of a partitioned table (``sql.partitions``: a finished job's row is
    written once, in its day's partition)."""
    if partitions.is_partitioned(cursor, table):
        return partitions.partition_name(table, "_active")
    return table


def sync_fillfactor(models: Iterable[type[Model]], using: str = "default") -> list[str]:
    """Set ``DBWORKER["FILLFACTOR"]`` on the tables of the job ``models`` of database
    ``using`` where it differs (None: leave every table as it is); return the tables
    changed. Run by ``migrate`` (``post_migrate``)."""
    wanted = conf.get("FILLFACTOR")
    connection = connections[using]
    if wanted is None or connection.vendor != "postgresql":
        return []
    changed = []
    with connection.cursor() as cursor:
        for model in migrated(models, using):
            table = connection.ops.quote_name(storage_table(cursor, model._meta.db_table))
            if fillfactor_of(cursor, table) != wanted:
                # SHARE UPDATE EXCLUSIVE: claims, outcomes and inserts go on meanwhile.
                cursor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(wanted)})")
                changed.append(model._meta.db_table)
    return changed
