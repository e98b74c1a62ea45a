"""Wake-ups by probing, where no ``NOTIFY`` comes (SQLite, MariaDB, PostgreSQL with
``DBWORKER["NOTIFY"] = False``): while one of its lanes polls, the dispatcher reads the
largest key of each job table every ``DBWORKER["PROBE_INTERVAL"]`` seconds. A larger
key than the last one read means rows were inserted: the table's lanes claim at once,
as after a notification. The read is one look at the end of the primary key (the
index alone, on every vendor), so probing often costs the database next to nothing;
the claim, which reads the dequeue condition, runs only when there is news.

What a probe does not see (the lanes' polling, backing off to ``max_interval``,
still finds them): rows made claimable without an insert (an operator's retry from
another process, a ``process_after`` that comes due), and an insert whose key is
lower than one committed before it (a transaction that took its key first and
committed last). Tables with keys that do not grow (UUIDs) are not probed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .. import conf
from ..sql.notify import enabled

if TYPE_CHECKING:
    from ..sql.connection import Runner
    from .lane import Lane


class Probe:
    """The probes of the tables of ``lanes`` that get no notifications."""

    def __init__(self, lanes: Iterable[Lane]) -> None:
        interval = conf.get("PROBE_INTERVAL")
        self.interval = float(interval) if interval else 0.0
        #: (alias, table) → [statement, the largest key last read (None: not yet)]
        self._tables: dict[tuple[str, str], list[Any]] = {}
        self._lanes: dict[tuple[str, str], list[Lane]] = {}
        for lane in lanes:
            if not self.interval or enabled(lane.alias) or not lane.stmts.int_keys:
                continue
            key = (lane.alias, lane.table)
            largest = f"SELECT MAX({lane.stmts.col['pk']}) FROM {lane.stmts.table}"
            self._tables.setdefault(key, [largest, None])
            self._lanes.setdefault(key, []).append(lane)
        self.next_at = 0.0

    def __bool__(self) -> bool:
        return bool(self._tables)

    def run(self, now: float, conn: Callable[[str], Runner], news: Callable[[str], None]) -> float:
        """Probe the tables with a lane that polls now (not one claiming at once, nor
        one whose slots are all taken); ``news(table)`` for each that grew. Seconds until
        the next probe is due."""
        if now < self.next_at:
            return self.next_at - now
        self.next_at = now + self.interval
        for (alias, table), probe in self._tables.items():
            if not any(_polling(lane, now) for lane in self._lanes[(alias, table)]):
                continue
            [(largest,)] = conn(alias).execute(probe[0])
            # The first read is news too when the table holds rows: a row inserted after
            # the lane's last claim may be among them (one claim more, at most).
            if largest is not None and (probe[1] is None or largest > probe[1]):
                news(table)
            probe[1] = largest
        return self.interval


def _polling(lane: Lane, now: float) -> bool:
    return lane.next_claim_at > now and lane.next_claim_at != float("inf") and lane.free_slots() > 0
