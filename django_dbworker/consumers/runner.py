"""Runs a worker's consumers beside its lanes: a coordinator thread (leadership,
rebalancing, starting and stopping under the fence, the hung-batch watchdog) and one
thread per consumer this worker runs, each in its own database connection, kept
between batches whatever ``CONN_MAX_AGE`` says (``sql.connection.recycle_connections``:
a broken one is replaced).

The worker knows this only as a companion (``start(worker_id, fatal)``, ``stop()``,
``join()``, ``labels``): ``runworker`` builds it from the consumer classes it is
given. A batch that Python never returns from cannot be stopped from inside the
process: the watchdog counts it as a failed batch at each ``batch_timeout`` it runs
past, and once the consumer's failures in a row reach ``max_failures`` it calls
``fatal``: the worker drains its jobs and exits (code 1), and with the process gone
(its registry row removed) another worker takes the consumer over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from django.db import connection

from .. import conf
from ..runtime.listener import Listener
from ..sql.notify import WAKE_ALL, enabled
from ..sql.orm import recycle_connections
from .assignment import ensure_rows, owned, rebalance, release, try_start
from .batch import Batches, Fence, Lost, consumer_alias
from .consumer import Consumer

logger = logging.getLogger("django_dbworker.consumers")

#: Longest pause after repeated failures of one batch.
MAX_BACKOFF = 60.0


class ConsumerThread(threading.Thread):
    def __init__(self, consumer: Consumer, fence: Fence, gap_threshold: float) -> None:
        super().__init__(name=f"dbworker-consumer-{consumer.name}", daemon=True)
        self.consumer = consumer
        self.fence = fence
        self.batches = Batches(consumer, fence, gap_threshold)
        self.gap_threshold = gap_threshold
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self._lock = threading.Lock()
        #: When the running batch started (monotonic; None between batches), and how
        #: often the watchdog counted it as failed.
        self._batch_started: float | None = None
        self.hangs = 0
        #: Given up by the watchdog: hung for good, never joined.
        self.abandoned = False

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def overdue(self, now: float) -> float | None:
        """The running batch's age if it ran past another ``batch_timeout`` since the
        watchdog last counted it (counted now), else None."""
        with self._lock:
            if self._batch_started is None:
                return None
            elapsed = now - self._batch_started
            if elapsed <= self.consumer.batch_timeout * (self.hangs + 1):
                return None
            self.hangs += 1
            return elapsed

    def _batch_begins(self) -> None:
        with self._lock:
            self._batch_started = time.monotonic()
            self.hangs = 0

    def _batch_ends(self) -> int:
        with self._lock:
            self._batch_started = None
            return self.hangs

    def run(self) -> None:
        c = self.consumer
        poll = c.poll_interval
        longest = max(poll, c.max_poll_interval or poll)
        idle = poll
        try:
            while not self.stopping.is_set():
                recycle_connections()
                self._batch_begins()
                try:
                    result = self.batches.run_once()
                except Lost:
                    logger.info("consumer %s: no longer ours, stopping", c.name)
                    return
                except Exception as exc:
                    failures = self.batches.failed(exc, counted=self._batch_ends())
                    delay = min(poll * 2 ** max(failures - 1, 0), MAX_BACKOFF)
                    logger.error(
                        "consumer %s: batch failed (%d in a row%s), retrying in %.1fs: %s",
                        c.name,
                        failures,
                        ", failing" if failures >= c.max_failures else "",
                        delay,
                        exc,
                        extra={"action": "consumer_failed", "consumer": c.name},
                    )
                    self.stopping.wait(delay)
                    continue
                self._batch_ends()
                if result.advanced:
                    idle = poll
                    if c.batch_pause:
                        self.stopping.wait(c.batch_pause)
                    continue  # more may be waiting: read the next window now
                if result.waiting_for is not None:  # a gap: look again soon, no back-off
                    wait = min(poll, max(self.gap_threshold / 10, 0.05))
                else:
                    wait, idle = idle, min(idle * 2, longest)
                if self.wake.wait(wait):
                    idle = poll
                self.wake.clear()
        finally:
            try:
                release(self.batches.alias, c.name, self.fence.worker_id)
            except Exception as exc:
                logger.warning("consumer %s: could not release: %s", c.name, exc)
            connection.close()


def _no_fatal(reason: str) -> None:
    logger.critical("consumers: %s (no worker to stop)", reason)


class ConsumerRunner:
    """The consumers of one worker process."""

    def __init__(
        self,
        consumers: Sequence[Consumer],
        *,
        lease: float | None = None,
        rebalance_interval: float | None = None,
    ) -> None:
        self.consumers = {c.name: c for c in consumers}
        self.lease = float(lease if lease is not None else conf.get("CONSUMER_LEASE"))
        self.rebalance_interval = float(
            rebalance_interval
            if rebalance_interval is not None
            else conf.get("CONSUMER_REBALANCE_INTERVAL")
        )
        first = next(iter(self.consumers.values()))
        self.alias = consumer_alias(first)
        self.worker_id = ""
        self.threads: dict[str, ConsumerThread] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.listener: Listener | None = None
        self.fatal: Callable[[str], None] = _no_fatal

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.consumers.values()]

    def gap_threshold(self, consumer: Consumer) -> float:
        value = consumer.gap_threshold
        return float(value if value is not None else conf.get("CONSUMER_GAP_THRESHOLD"))

    def start(self, worker_id: str, fatal: Callable[[str], None] | None = None) -> None:
        """Run; ``fatal(reason)`` ends the worker process (a batch hung for good)."""
        self.worker_id = worker_id
        if fatal is not None:
            self.fatal = fatal
        self._thread = threading.Thread(target=self._run, name="dbworker-consumers", daemon=True)
        self._thread.start()
        if enabled(self.alias):
            tables = {c.model._meta.db_table for c in self.consumers.values() if c.model}
            self.listener = Listener(self.alias, tables, self.on_notify)
            self.listener.start()

    def on_notify(self, table: str) -> None:
        for name, thread in list(self.threads.items()):
            model = self.consumers[name].model
            if table == WAKE_ALL or (model is not None and model._meta.db_table == table):
                thread.wake.set()

    def stop(self) -> None:
        self._stopping.set()
        if self.listener is not None:
            self.listener.stop()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
        if self.listener is not None:
            self.listener.join(2.0)

    # -- the coordinator thread ---------------------------------------------------------

    def _run(self) -> None:
        tick = min(1.0, self.rebalance_interval / 2)
        next_rebalance = 0.0
        first = True
        try:
            while not self._stopping.is_set():
                recycle_connections()
                self._watch()
                try:
                    if time.monotonic() >= next_rebalance:
                        self._ensure_rows(first)
                        first = False
                        changed = rebalance(self.alias, self.lease)
                        next_rebalance = time.monotonic() + self.rebalance_interval
                        if changed:
                            logger.info(
                                "consumers reassigned: %s",
                                ", ".join(f"{n} → {w or 'nobody'}" for n, w in changed.items()),
                                extra={"action": "consumers_rebalanced"},
                            )
                    self._follow(owned(self.alias, self.worker_id))
                except Exception as exc:
                    logger.warning("consumers: coordination failed, retrying: %s", exc)
                self._stopping.wait(tick)
        finally:
            for thread in self.threads.values():
                thread.stop()
            for name, thread in self.threads.items():
                if not thread.abandoned:
                    thread.join(self.consumers[name].batch_timeout + 5.0)
            connection.close()

    def _ensure_rows(self, first: bool) -> None:
        """A checkpoint row for each of our consumers, every round: a row deleted while
        the worker runs is created again at the consumer's ``start_position`` (a reset
        to it), so the consumer never goes silently missing."""
        created = ensure_rows(self.alias, list(self.consumers.values()))
        for name in created if not first else ():
            logger.warning(
                "consumer %s: its checkpoint row was deleted; created again at its "
                "start_position %d",
                name,
                self.consumers[name].start_position,
                extra={"action": "consumer_recreated", "consumer": name},
            )

    def _watch(self) -> None:
        """Count the batches that run past their timeout; give up a consumer whose
        failures in a row reach ``max_failures`` while its batch still runs."""
        now = time.monotonic()
        for name, thread in list(self.threads.items()):
            if thread.abandoned:
                continue
            elapsed = thread.overdue(now)
            if elapsed is None:
                continue
            consumer = thread.consumer
            failures = thread.batches.hung(elapsed)
            if failures is None:  # not written: what this process knows
                failures = thread.batches.failures + thread.hangs
            logger.error(
                "consumer %s: batch still running after %.1fs (batch_timeout %gs): "
                "counted as failed (%d in a row, max_failures %d)",
                name,
                elapsed,
                consumer.batch_timeout,
                failures,
                consumer.max_failures,
                extra={"action": "consumer_hung", "consumer": name},
            )
            if failures >= consumer.max_failures:
                thread.abandoned = True
                reason = (
                    f"consumer {name}: a batch hung for {elapsed:.1f}s "
                    f"({failures} failed batches in a row)"
                )
                logger.critical(
                    "%s; ending this worker process so that another one runs it "
                    "(a hung thread cannot be stopped from inside Python)",
                    reason,
                    extra={"action": "consumer_given_up", "consumer": name},
                )
                self.fatal(reason)

    def _follow(self, mine: dict[str, int]) -> None:
        """Stop what is no longer ours (or of an old generation), start what is."""
        for name, thread in list(self.threads.items()):
            if mine.get(name) != thread.fence.generation:
                thread.stop()
            if not thread.is_alive():
                thread.join()
                del self.threads[name]
        for name, generation in sorted(mine.items()):
            consumer = self.consumers.get(name)
            if consumer is None or name in self.threads:
                continue
            if try_start(self.alias, consumer, self.worker_id, generation, self.lease):
                fence = Fence(name, self.worker_id, generation)
                thread = ConsumerThread(consumer, fence, self.gap_threshold(consumer))
                self.threads[name] = thread
                thread.start()
                logger.info(
                    "consumer %s started (generation %d)",
                    name,
                    generation,
                    extra={"action": "consumer_started", "consumer": name},
                )
