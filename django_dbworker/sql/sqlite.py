"""SQLite: one writer at a time (a statement is atomic), the worker's clock through
``dbworker_time()``, keys as JSON arrays."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .dialects import Dialect, param


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    now = "dbworker_time(0)"

    def after(self, seconds: str) -> str:
        return f"dbworker_time({seconds})"

    def in_ids(self, name: str, pk_type: str) -> str:
        return f"IN (SELECT value FROM json_each({param(name)}))"

    def ids(self, keys: Sequence[Any], integers: bool) -> Any:
        return json.dumps([int(pk) for pk in keys] if integers else [str(pk) for pk in keys])

    def as_json(self, name: str) -> str:
        return f"json({param(name)})"

    def json_member(self, name: str, key: str) -> str:
        return f"json_extract({param(name)}, '$.\"' || ({key}) || '\"')"

    def json_append(self, column: str, value: str, *, text: bool = False) -> str:
        return f"json_insert({column}, '$[#]', {value if text else f'json({value})'})"

    def with_results(self, table: str, pk: str, column: str, pk_type: str) -> tuple[str, str]:
        return (
            "",
            f"(SELECT json(json_extract(value, '$[1]')) FROM json_each(%(results)s) "
            f"WHERE json_extract(value, '$[0]') = {table}.{pk})",
        )

    def results_param(self, pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
        return {"results": json.dumps([[key, value] for key, value in pairs])}

    def holders(self, name: str) -> str:
        return (
            "(SELECT json_extract(value, '$[0]') AS worker, json_extract(value, '$[1]') AS age, "
            f"json_extract(value, '$[2]') AS resets FROM json_each({param(name)})) AS h"
        )

    def holders_params(
        self, name: str, holders: Sequence[tuple[str, float, int]]
    ) -> dict[str, Any]:
        return {name: json.dumps([list(holder) for holder in holders])}
