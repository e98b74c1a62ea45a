"""PostgreSQL: row locks with ``SKIP LOCKED``, the server's clock, arrays of keys."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .dialects import Dialect, param


class PostgresDialect(Dialect):
    vendor = "postgresql"
    row_locks = True
    ordered_claims = True
    now = "now()"
    # NO KEY UPDATE: what our UPDATEs take anyway; it does not conflict with FOR KEY
    # SHARE, which a transaction inserting a row that references the job holds.
    skip_locked = " FOR NO KEY UPDATE SKIP LOCKED"
    limit_written = True

    # The clock at the call, not at the transaction's start: a claim of a limited handler
    # may have waited for the lock of another.
    epoch = "extract(epoch from clock_timestamp())::float8"

    def least(self, *values: str) -> str:
        return f"LEAST({', '.join(values)})"

    def estimated_rows(self, connection: Any, sql: str, params: Sequence[Any]) -> int | None:
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        return int(plan[0]["Plan"]["Plan Rows"])

    def greatest(self, *values: str) -> str:
        return f"GREATEST({', '.join(values)})"

    def json_object(self, pairs: Sequence[tuple[str, str]]) -> str:
        return "jsonb_build_object(" + ", ".join(f"'{k}', {v}" for k, v in pairs) + ")"

    def log_summary(self, column: str, most: int) -> str:
        return (
            "(SELECT COALESCE(jsonb_agg(jsonb_build_object('key', e -> 'key', 'exit_code', "
            "e -> 'exit_code')), '[]'::jsonb) FROM (SELECT e FROM jsonb_array_elements("
            f"COALESCE({column}, '[]'::jsonb)) AS e LIMIT {int(most)}) AS dbw_logs)"
        )

    def json_append_bounded(self, column: str, value: str, most: int) -> str:
        return (
            f"(CASE WHEN jsonb_array_length({column}) >= {int(most)} THEN {column} - 0 "
            f"ELSE {column} END) || jsonb_build_array({value})"
        )

    def among(self, value: str, subquery: str) -> str:
        return f"{value} = ANY(ARRAY({subquery}))"

    def not_among(self, value: str, subquery: str) -> str:
        # An array built once: an anti-join would probe the set once per row scanned.
        return f"{value} <> ALL(ARRAY({subquery}))"

    def floor_int(self, value: str) -> str:
        return f"floor({value})::bigint"

    def after(self, seconds: str) -> str:
        return f"now() + make_interval(secs => {seconds})"

    def seconds_until(self, value: str) -> str:
        return f"extract(epoch from ({value}) - now())::float8"

    def in_ids(self, name: str, pk_type: str) -> str:
        return f"= ANY({param(name)}::{pk_type}[])"

    def in_uncounted_ids(self, name: str, pk_type: str) -> str:
        # A custom plan counts an array parameter's elements, a generic plan takes ten.
        return f"= ANY(ARRAY(SELECT unnest({param(name)}::{pk_type}[])))"

    def ids(self, keys: Sequence[Any], integers: bool) -> Any:
        # An array literal is far cheaper for psycopg to send than a list of integers.
        if integers:
            return "{" + ",".join(str(int(pk)) for pk in keys) + "}"
        return list(keys)

    def as_json(self, name: str) -> str:
        return f"{param(name)}::jsonb"

    def json_append(self, column: str, value: str, *, text: bool = False) -> str:
        return f"{column} || jsonb_build_array(({value})::{'varchar' if text else 'jsonb'})"

    def json_member(self, name: str, key: str, pk_type: str) -> str:
        # ``->`` with a text operand looks the member up by its name: no path.
        return f"({param(name)}::jsonb -> ({key})::text)"

    def members_param(self, pairs: Sequence[tuple[Any, str]]) -> Any:
        return "{" + ", ".join(f"{json.dumps(str(key))}: {value}" for key, value in pairs) + "}"

    def with_results(self, table: str, pk: str, column: str, pk_type: str) -> tuple[str, str]:
        return (
            f" FROM (SELECT unnest(%(result_keys)s::{pk_type}[]) AS dbw_key, "
            "unnest(%(result_values)s::text[]) AS dbw_value) AS dbw_results",
            "dbw_results.dbw_value::jsonb",
        )

    def results_param(self, pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
        return {
            "result_keys": [key for key, _ in pairs],
            "result_values": [value for _, value in pairs],
        }

    def lock_of(self, alias: str) -> str:
        return f" FOR NO KEY UPDATE OF {alias} SKIP LOCKED"

    def fenced(self, table: str, pk: str, match: str) -> str:
        return f"{pk} IN (SELECT {pk} FROM {table} WHERE {match}{self.skip_locked})"

    def ordered(self, update: str, ordering: str, ctes: str = "", after: str = "") -> str:
        before = f"{ctes}, " if ctes else ""
        later = f", {after}" if after else ""
        return (
            f"WITH {before}claimed AS ({update}){later} SELECT * FROM claimed ORDER BY {ordering}"
        )

    def holders(self, name: str) -> str:
        return (
            f"unnest({param(name + '_workers')}::text[], {param(name + '_ages')}::float8[], "
            f"{param(name + '_resets')}::integer[]) AS h(worker, age, resets)"
        )

    def holders_params(
        self, name: str, holders: Sequence[tuple[str, float, int]]
    ) -> dict[str, Any]:
        return {
            f"{name}_workers": [holder[0] for holder in holders],
            f"{name}_ages": [holder[1] for holder in holders],
            f"{name}_resets": [holder[2] for holder in holders],
        }
