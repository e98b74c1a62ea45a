"""``BENCH_SECOND_URL``: ``OtherBenchJob`` lives on the alias ``second`` (benchmarks/multidb.py).
Every table is migrated on both servers (the package's must be beside the jobs; the
"one server" arrangement keeps OtherBenchJob on the first)."""

from __future__ import annotations

from typing import Any


class SecondRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "second" if model._meta.label_lower == "benchproject.otherbenchjob" else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.db_for_read(model)
