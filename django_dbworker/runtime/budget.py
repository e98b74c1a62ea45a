"""How many database connections a worker process may hold at most, from its handlers
and the settings: what docs/operations.md (§ Behind a connection pooler) states and
the system check ``dbworker.W007`` holds against ``DBWORKER["CONNECTION_BUDGET"]``.

A worker process holds, per database its job tables (and the worker registry) live
in, three bookkeeping connections of its own: the dispatcher's (claims and the
resetter), the heartbeat's (heartbeats, the registry row) and the
writer's (outcomes, execution logs, statistics); one LISTEN connection per
database with wake-ups on (PostgreSQL, ``NOTIFY``); one more while a retention pass
runs. Django's own connections come on top: one per handler thread whose handler
uses the ORM (the async handlers of a process share one thread for it), and one
for the dispatcher thread's hooks (``pre_dequeue``, ``get_queryset``) and
schedules; with ``OPTIONS["pool"]`` those share the pool, which never holds more
than its ``max_size``. ``CONN_MAX_AGE`` only decides whether a handler thread's
connection lasts between jobs: at full load each thread holds one either way.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

from django.db import connections, router

from .. import conf
from ..handler import Handler
from ..sql.notify import enabled

#: psycopg_pool's default ``min_size`` (``max_size`` defaults to it).
POOL_DEFAULT_SIZE = 4


@dataclasses.dataclass
class Need:
    """The most connections of each kind one worker process may hold at once."""

    own: int = 0
    listeners: int = 0
    retention: int = 0
    orm: int = 0
    #: Databases whose Django connections come from a pool (capped at its max_size).
    pooled: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return self.own + self.listeners + self.retention + self.orm

    def describe(self) -> str:
        parts = [f"{self.own} of its own"]
        if self.listeners:
            parts.append(f"{self.listeners} LISTEN")
        if self.retention:
            parts.append(f"{self.retention} during retention passes")
        if self.orm:
            pool = f" (pool of {', '.join(self.pooled)})" if self.pooled else ""
            parts.append(f"{self.orm} for handlers and hooks that use the ORM{pool}")
        return ", ".join(parts)


def pool_sizes(alias: str) -> tuple[int, int] | None:
    """The fewest and the most connections Django's pool of ``alias`` holds; None
    without a pool."""
    pool = (connections[alias].settings_dict.get("OPTIONS") or {}).get("pool")
    if not pool:
        return None
    options: dict[str, Any] = pool if isinstance(pool, dict) else {}
    smallest = int(options.get("min_size") or POOL_DEFAULT_SIZE)
    return smallest, int(options.get("max_size") or smallest)


def worker_need(handlers: Sequence[Handler | type[Handler]]) -> Need:
    """What one ``runworker`` process running ``handlers`` may hold at most."""
    need = Need()
    aliases: dict[str, int] = {}  # alias -> Django connections of its handler threads
    asynchronous: set[str] = set()
    for handler in handlers:
        if handler.model is None:
            continue
        alias = router.db_for_write(handler.model)
        aliases.setdefault(alias, 1)  # the dispatcher thread's hooks and schedules
        if inspect.iscoroutinefunction(handler.handle):
            asynchronous.add(alias)  # one shared thread for the ORM of async handlers
        else:
            aliases[alias] += int(handler.num_handlers)
        if handler.retention and conf.get("RETENTION_INTERVAL") is not None:
            need.retention = 1
    for alias in asynchronous:
        aliases[alias] += 1
    # Its registry rows are beside its jobs: the heartbeat's connections there hold them.
    need.own = 3 * len(aliases)
    need.listeners = sum(1 for alias in aliases if enabled(alias))
    for alias, threads in aliases.items():
        sizes = pool_sizes(alias)
        if sizes is not None:
            need.pooled.append(alias)
            threads = max(min(threads, sizes[1]), sizes[0])
        need.orm += threads
    return need
