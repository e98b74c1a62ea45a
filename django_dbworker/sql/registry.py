"""The statements of the worker registry (each worker process keeps one row)."""

from __future__ import annotations

import functools

from django.db import connections, models

from .dialects import dialect_for, param


class RegistryStatements:
    """For the registry model (``WorkerProcess``, passed in: this layer does not import
    models) on one database. Parameters are named in each comment."""

    def __init__(self, model: type[models.Model], alias: str) -> None:
        wrapper = connections[alias]
        d = dialect_for(wrapper)
        quote = wrapper.ops.quote_name
        table = quote(model._meta.db_table)
        col = {f.name: quote(str(f.column)) for f in model._meta.concrete_fields}
        now = d.now
        #: worker_id, hostname, pid, handlers (JSON), num_handlers, threads (JSON), jobs
        #: (JSON), num_jobs, num_connections, heartbeat_interval, tables (JSON), pool
        #: (JSON or None). A row of this worker id already there is this process's own
        #: (an insert whose reply was lost, tried again): left as it is, the next beat
        #: refreshes it.
        self.insert = (
            f"INSERT INTO {table} ({col['worker_id']}, {col['hostname']}, {col['pid']}, "
            f"{col['handlers']}, {col['num_handlers']}, {col['threads']}, {col['jobs']}, "
            f"{col['num_jobs']}, {col['num_connections']}, {col['heartbeat_interval']}, "
            f"{col['tables']}, {col['pool']}, {col['started_at']}, {col['last_heartbeat_at']}) "
            f"VALUES (%(worker_id)s, %(hostname)s, %(pid)s, {d.as_json('handlers')}, "
            f"%(num_handlers)s, {d.as_json('threads')}, {d.as_json('jobs')}, %(num_jobs)s, "
            f"%(num_connections)s, %(heartbeat_interval)s, {d.as_json('tables')}, "
            f"{d.as_json('pool')}, {now}, {now}) "
            f"{d.keep_existing([col['worker_id']])}"
        )
        #: → (worker_id, tables) of every row.
        self.holders = f"SELECT {col['worker_id']}, {col['tables']} FROM {table}"
        #: jobs (JSON), num_jobs, num_connections, pool (JSON or None), worker_id → id if
        #: the row exists.
        self.beat = (
            f"UPDATE {table} SET {col['last_heartbeat_at']} = {now}, "
            f"{col['jobs']} = {d.as_json('jobs')}, {col['num_jobs']} = %(num_jobs)s, "
            f"{col['num_connections']} = %(num_connections)s, {col['pool']} = "
            f"{d.as_json('pool')} "
            f"WHERE {col['worker_id']} = %(worker_id)s RETURNING {col['id']}"
        )
        #: worker_id.
        self.delete = f"DELETE FROM {table} WHERE {col['worker_id']} = %(worker_id)s"
        #: retention (s): rows silent that long.
        self.prune = (
            f"DELETE FROM {table} WHERE {col['last_heartbeat_at']} < "
            f"{d.after('-' + param('retention'))}"
        )


@functools.cache
def registry_statements(model: type[models.Model], alias: str) -> RegistryStatements:
    return RegistryStatements(model, alias)
