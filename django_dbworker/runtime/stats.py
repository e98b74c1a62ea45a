"""The worker's per-minute statistics: outcomes and attempt durations per handler,
written to ``JobStats`` (the admin's dashboard reads them).

Fed by the outcome writer thread (``finished``), which also writes them: every
``FLUSH_EVERY`` seconds while outcomes come, when it runs out of outcomes to write (at
most every ``IDLE_FLUSH_AFTER`` seconds), and at the end. Each write replaces this
worker's row of a minute with its totals, so a failed write is simply made again by the
next; minutes that are over and written are forgotten. A row per (minute, handler,
worker): a busy worker writes a few statements a minute, whatever its throughput.
The rows of a handler are written beside its jobs, in their database (one out of reach
holds up the others' rows not at all).
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..sql.connection import Connections
from ..sql.stats import COUNTERS, stats_statements
from ..stats import DURATION_BUCKETS, JobStats, bucket_of
from .events import Observer, Written

if TYPE_CHECKING:
    from .lane import Lane

logger = logging.getLogger("django_dbworker.writer")

#: Seconds between two writes of the statistics while outcomes keep coming.
FLUSH_EVERY = 10.0
#: Seconds after the last write before an idle writer writes again: a drain goes idle
#: between every two claims, and a statement each time cost more than the jobs' own.
IDLE_FLUSH_AFTER = 1.0


class Minute:
    """One handler's figures of one minute, in this worker."""

    def __init__(self, model: str, alias: str) -> None:
        self.model = model
        #: The database of the handler's jobs, where the row is written.
        self.alias = alias
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.duration_sum = 0.0
        self.durations = [0] * (len(DURATION_BUCKETS) + 1)
        self.dirty = True


class Stats(Observer):
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.minutes: dict[tuple[int, str], Minute] = {}
        self._conn = Connections("stats")
        self._flushed_at = time.monotonic()
        #: The databases whose last write failed (said once).
        self._failed: set[str] = set()

    def finished(self, lane: Lane, written: Sequence[Written]) -> None:
        minute = int(time.time() // 60)
        entry = self.minutes.get((minute, lane.label))
        if entry is None:
            entry = self.minutes[(minute, lane.label)] = Minute(lane.model._meta.label, lane.alias)
        counts, durations = entry.counts, entry.durations
        for _, outcome, state in written:
            key = "lost" if state is None else "requeued" if state == "queued" else state
            counts[key] = counts.get(key, 0) + 1
            entry.duration_sum += outcome.duration
            durations[bucket_of(outcome.duration)] += 1
        entry.dirty = True
        if time.monotonic() - self._flushed_at >= FLUSH_EVERY:
            self.flush()

    def _dirty(self) -> bool:
        return any(m.dirty for m in self.minutes.values())

    def idle(self) -> float | None:
        if not self._dirty():
            return None
        wait = self._flushed_at + IDLE_FLUSH_AFTER - time.monotonic()
        if wait > 0:
            return wait
        self.flush()
        return None

    def close(self) -> None:
        if self._dirty():
            self.flush()
        self._conn.close()

    def flush(self) -> None:
        """Write the rows that changed; forget the minutes that are over and written."""
        self._flushed_at = time.monotonic()
        now_minute = int(time.time() // 60)
        for alias in dict.fromkeys(m.alias for m in self.minutes.values()):
            self._flush(alias, now_minute)

    def _flush(self, alias: str, now_minute: int) -> None:
        conn = Connections.of_thread(self._conn)(alias)  # the writer's, in a worker
        sql = stats_statements(JobStats, alias).upsert
        adapt = conn.wrapper.ops.adapt_datetimefield_value
        try:
            for (minute, handler), entry in list(self.minutes.items()):
                if entry.alias != alias:
                    continue
                if entry.dirty:
                    start = datetime.datetime.fromtimestamp(minute * 60, tz=datetime.UTC)
                    conn.execute(sql, self._params(adapt(_aware(start)), handler, entry))
                    entry.dirty = False
                if minute < now_minute:
                    del self.minutes[(minute, handler)]
            self._failed.discard(alias)
        except Exception as exc:  # written again at the next flush
            if alias not in self._failed:
                logger.warning("could not write the job statistics (%s); will retry", exc)
            self._failed.add(alias)
            conn.close()

    def _params(self, minute: Any, handler: str, entry: Minute) -> dict[str, Any]:
        return {
            "minute": minute,
            "handler": handler,
            "model": entry.model,
            "worker": self.worker_id,
            **entry.counts,
            "duration_sum": entry.duration_sum,
            "durations": json.dumps(entry.durations),
        }


def _aware(value: datetime.datetime) -> datetime.datetime:
    """A UTC datetime as Django stores it (naive when ``USE_TZ`` is off)."""
    from django.conf import settings

    return value if settings.USE_TZ else timezone.make_naive(value)
