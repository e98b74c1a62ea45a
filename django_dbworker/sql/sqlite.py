"""SQLite: one writer at a time (a statement is atomic), the worker's clock through
``dbworker_time()``, keys as JSON arrays."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from .dialects import Dialect, param


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    now = "dbworker_time(0)"
    single_writer = True

    epoch = "dbworker_epoch()"

    def clock(self, connection: BaseDatabaseWrapper) -> datetime.datetime:
        # This machine's: the file is on it (``now`` is ``dbworker_time``, the same).
        return timezone.now()

    def least(self, *values: str) -> str:
        assert len(values) > 1  # MIN() of one value is the aggregate
        return f"MIN({', '.join(values)})"

    def greatest(self, *values: str) -> str:
        assert len(values) > 1
        return f"MAX({', '.join(values)})"

    def floor_int(self, value: str) -> str:
        return f"CAST({value} AS INTEGER)"

    def after(self, seconds: str) -> str:
        return f"dbworker_time({seconds})"

    def seconds_until(self, value: str) -> str:
        return f"(julianday({value}) - julianday({self.now})) * 86400.0"

    def in_ids(self, name: str, pk_type: str) -> str:
        return f"IN (SELECT value FROM json_each({param(name)}))"

    def ids(self, keys: Sequence[Any], integers: bool) -> Any:
        return json.dumps([int(pk) for pk in keys] if integers else [str(pk) for pk in keys])

    def as_json(self, name: str) -> str:
        return f"json({param(name)})"

    def json_member(self, name: str, key: str, pk_type: str) -> str:
        # ``key`` qualified by its table: json_each has columns of its own (``id``).
        return (
            f"(SELECT json(json_extract(value, '$[1]')) FROM json_each({param(name)}) "
            f"WHERE json_extract(value, '$[0]') = {key})"
        )

    def members_param(self, pairs: Sequence[tuple[Any, str]]) -> Any:
        return json.dumps([[_json_key(key), value] for key, value in pairs])

    def json_append(self, column: str, value: str, *, text: bool = False) -> str:
        return f"json_insert({column}, '$[#]', {value if text else f'json({value})'})"

    def with_results(self, table: str, pk: str, column: str, pk_type: str) -> tuple[str, str]:
        return "", self.json_member("results", f"{table}.{pk}", pk_type)

    def results_param(self, pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
        return {"results": self.members_param(pairs)}

    def json_object(self, pairs: Sequence[tuple[str, str]]) -> str:
        return "json_object(" + ", ".join(f"'{k}', {v}" for k, v in pairs) + ")"

    def iso_time(self, value: str) -> str:
        # Django stores "YYYY-MM-DD HH:MM:SS.ffffff", in UTC when USE_TZ.
        offset = " || '+00:00'" if settings.USE_TZ else ""
        return f"(replace({value}, ' ', 'T'){offset})"

    def log_summary(self, column: str, most: int) -> str:
        return (
            "(SELECT json_group_array(json_object('key', json_extract(value, '$.key'), "
            "'exit_code', json_extract(value, '$.exit_code'))) FROM (SELECT value FROM "
            f"json_each(COALESCE({column}, '[]')) LIMIT {int(most)}))"
        )

    def json_append_bounded(self, column: str, value: str, most: int) -> str:
        return (
            f"json_insert(CASE WHEN json_array_length({column}) >= {int(most)} THEN "
            f"json_remove({column}, '$[0]') ELSE {column} END, '$[#]', json({value}))"
        )

    def holders(self, name: str) -> str:
        return (
            "(SELECT json_extract(value, '$[0]') AS worker, json_extract(value, '$[1]') AS age, "
            f"json_extract(value, '$[2]') AS resets FROM json_each({param(name)})) AS h"
        )

    def holders_params(
        self, name: str, holders: Sequence[tuple[str, float, int]]
    ) -> dict[str, Any]:
        return {name: json.dumps([list(holder) for holder in holders])}


def _json_key(key: Any) -> Any:
    """A key as a JSON array holds it to compare with the column: integers as numbers,
    anything else as its text."""
    return key if isinstance(key, int) else str(key)
