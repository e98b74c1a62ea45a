"""Retention: deleting finished jobs once their handler's ``retention`` has passed.

Small batches (``BATCH`` rows per statement, rows another transaction locks
skipped) within a time budget per pass, so pruning a large backlog never holds
long locks or starves claims; a later pass goes on where this one stopped.
Never a queued, errored or processing row: only the states a handler names.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db import connections, router

from ..handler import Handler, seconds
from ..runtime.logs import extra
from ..sql.connection import Connections
from ..sql.filters import FILTER_ERRORS, compile_filter
from ..sql.jobs import statements_for
from ..states import FINAL_STATES

logger = logging.getLogger("django_dbworker.retention")

#: Rows one statement deletes at most.
BATCH = 100
#: Seconds one pass may spend deleting.
PASS_BUDGET = 2.0
#: After each batch, rest this many times as long as the batch took.
REST = 1.0


class Retention:
    """For the handlers that set ``retention`` (one entry per model, filter and state)."""

    def __init__(self, handlers: Sequence[Handler]) -> None:
        self.rules: list[tuple[Handler, str, float]] = []
        for handler in handlers:
            for state, age in (handler.retention or {}).items():
                if state not in FINAL_STATES:
                    raise ValueError(f"{handler.get_name()}: retention of {state!r}: not final")
                self.rules.append((handler, str(state), float(seconds(age) or 0.0)))
        self.conn = Connections("retention")

    def __bool__(self) -> bool:
        return bool(self.rules)

    def close(self) -> None:
        self.conn.close()

    def run_once(
        self, budget: float = PASS_BUDGET, stopping: threading.Event | None = None
    ) -> dict[str, int]:
        """Delete what is due, within ``budget`` seconds (or until ``stopping`` is set);
        how many rows per handler."""
        deadline = time.monotonic() + budget
        deleted: dict[str, int] = {}
        for handler, state, age in self.rules:
            count = self._prune(handler, state, age, deadline, stopping or threading.Event())
            if count:
                deleted[handler.get_name()] = deleted.get(handler.get_name(), 0) + count
        for name, count in deleted.items():
            logger.info(
                "%s: deleted %d finished jobs past their retention",
                name,
                count,
                extra=extra("pruned", handler=name, count=count),
            )
        return deleted

    def _prune(
        self, handler: Handler, state: str, age: float, deadline: float, stopping: threading.Event
    ) -> int:
        model = handler.model
        assert model is not None
        alias = router.db_for_write(model)
        stmts = statements_for(model, connections[alias].vendor, alias)
        conn = self.conn(alias)
        where: str = ""
        params: dict[str, Any] = {}
        if handler.dequeue_filter is not None:
            try:
                compiled = compile_filter(
                    model, handler.dequeue_filter, conn.wrapper, stmts.col["pk"], "keep"
                )
            except FILTER_ERRORS:
                return 0  # the handler claims nothing either (dbworker.E004)
            if compiled is None:
                return 0
            where, params = compiled
        sql = stmts.prune(where)
        total = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            rows = conn.execute(sql, {**params, "state": state, "age": age, "batch": BATCH})
            total += len(rows)
            if len(rows) < BATCH:
                break
            # Leave the database to the claims for as long again as the batch took.
            if stopping.wait((time.monotonic() - started) * REST):
                break
        return total
