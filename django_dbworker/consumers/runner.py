"""Runs a worker's consumers beside its lanes: a coordinator thread (leadership,
rebalancing, starting and stopping under the fence) and one thread per consumer this
worker runs, each in its own database connection.

The worker knows this only as a companion (``start(worker_id)``, ``stop()``,
``join()``, ``labels``): ``runworker`` builds it from the consumer classes it is
given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from django.db import close_old_connections, connection

from .. import conf
from ..runtime.listener import Listener
from ..sql.notify import WAKE_ALL, enabled
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

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def run(self) -> None:
        c = self.consumer
        try:
            while not self.stopping.is_set():
                close_old_connections()
                try:
                    result = self.batches.run_once()
                except Lost:
                    logger.info("consumer %s: no longer ours, stopping", c.name)
                    return
                except Exception as exc:
                    failures = self.batches.failed(exc)
                    delay = min(c.poll_interval * 2 ** max(failures - 1, 0), MAX_BACKOFF)
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
                if result.advanced:
                    continue  # more may be waiting: read the next window now
                wait = c.poll_interval
                if result.waiting_for is not None:
                    wait = min(wait, max(self.gap_threshold / 10, 0.05))
                self.wake.wait(wait)
                self.wake.clear()
        finally:
            try:
                release(self.batches.alias, c.name, self.fence.worker_id)
            except Exception as exc:
                logger.warning("consumer %s: could not release: %s", c.name, exc)
            connection.close()


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

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.consumers.values()]

    def gap_threshold(self, consumer: Consumer) -> float:
        value = consumer.gap_threshold
        return float(value if value is not None else conf.get("CONSUMER_GAP_THRESHOLD"))

    def start(self, worker_id: str) -> None:
        self.worker_id = worker_id
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
        ready = False
        try:
            while not self._stopping.is_set():
                close_old_connections()
                try:
                    if not ready:
                        ensure_rows(
                            self.alias,
                            [(c.name, c.start_position) for c in self.consumers.values()],
                        )
                        ready = True
                    if time.monotonic() >= next_rebalance:
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
                thread.join(self.consumers[name].batch_timeout + 5.0)
            connection.close()

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
            if try_start(self.alias, name, self.worker_id, generation, self.lease):
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
