"""What the outcome writer holds for a database out of reach, when the job tables live on
several: that database's outcomes and execution logs wait, in their order, and are
tried again with backoff, while the writes of the others go on
(docs/operations.md § Several databases)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Sequence
from typing import Any

from .backoff import Backoff


@dataclasses.dataclass
class Waiting:
    """The items of one database waiting for it, and when to try them again."""

    backoff: Backoff
    retry_at: float
    items: list[Any] = dataclasses.field(default_factory=list)
    keys: set[Hashable] = dataclasses.field(default_factory=set)


class Outages:
    """Per database alias out of reach, the items (``(attempt, outcome or None)``)
    waiting for it. An item is held once, whichever writes of it failed."""

    def __init__(self) -> None:
        self._waiting: dict[str, Waiting] = {}
        #: Per alias, the backoff of its outage (kept while its retries fail).
        self._backoffs: dict[str, Backoff] = {}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def __contains__(self, alias: str) -> bool:
        return alias in self._waiting

    def hold(self, alias: str, items: Sequence[Any]) -> float:
        """Hold ``items`` for ``alias`` (which just failed, or is known down); the delay
        before the next try of that database."""
        waiting = self._waiting.get(alias)
        if waiting is None:
            backoff = self._backoffs.setdefault(alias, Backoff(base=0.2, cap=5.0))
            waiting = self._waiting[alias] = Waiting(backoff, time.monotonic() + backoff.next())
        for item in items:
            key = (id(item[0]), id(item[1]))
            if key not in waiting.keys:
                waiting.keys.add(key)
                waiting.items.append(item)
        return max(waiting.retry_at - time.monotonic(), 0.0)

    def due(self) -> list[Any]:
        """The items of the databases whose next try is due (taken out)."""
        now = time.monotonic()
        items: list[Any] = []
        for alias, waiting in list(self._waiting.items()):
            if now >= waiting.retry_at:
                items += waiting.items
                del self._waiting[alias]
        return items

    def reached(self, alias: str) -> None:
        """A write to ``alias`` went through: its next outage starts its backoff afresh."""
        self._backoffs.pop(alias, None)

    def next_at(self) -> float | None:
        """When the next database is to be tried again (monotonic), or None."""
        return min((w.retry_at for w in self._waiting.values()), default=None)

    def take_all(self) -> list[Any]:
        """Every item held (the writer gives up on them at shutdown)."""
        items = [item for waiting in self._waiting.values() for item in waiting.items]
        self._waiting.clear()
        return items
