"""The statements of the per-minute statistics (``JobStats``, passed in: this layer
does not import models)."""

from __future__ import annotations

import functools

from django.db import connections, models

from .dialects import dialect_for

#: The counters of a row, in the order the upsert takes them.
COUNTERS = ("completed", "errored", "failed", "canceled", "requeued", "lost")


class StatsStatements:
    def __init__(self, model: type[models.Model], alias: str) -> None:
        wrapper = connections[alias]
        d = dialect_for(wrapper)
        quote = wrapper.ops.quote_name
        table = quote(model._meta.db_table)
        col = {f.name: quote(str(f.column)) for f in model._meta.concrete_fields}
        names = ["minute", "handler", "model", "worker", *COUNTERS, "duration_sum"]
        values = [f"%({name})s" for name in names]
        replaced = [*COUNTERS, "duration_sum", "durations"]
        #: minute, handler, model, worker, the counters, duration_sum, durations (JSON):
        #: this worker's row of that minute, written whole (only this worker writes it).
        self.upsert = (
            f"INSERT INTO {table} ({', '.join(col[n] for n in [*names, 'durations'])}) "
            f"VALUES ({', '.join(values)}, {d.as_json('durations')}) "
            + d.upsert([col["minute"], col["handler"], col["worker"]], [col[n] for n in replaced])
        )
        #: before: rows of minutes before this time.
        self.prune = f"DELETE FROM {table} WHERE {col['minute']} < %(before)s"


@functools.cache
def stats_statements(model: type[models.Model], alias: str) -> StatsStatements:
    return StatsStatements(model, alias)
