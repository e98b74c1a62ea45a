"""The day partitions of partitioned job tables (``django_dbworker.partitions``), kept by
the retention pass: today's and the next days' made ahead, and those whose every job is
past its retention detached and dropped whole, where deleting their rows would take
minutes of batched ``DELETE``s.

A partition holds the jobs of every handler of its table that finished on its day
(UTC), in any final state: it goes when the longest ``retention`` among them has passed
since the day's end. Detaching takes a short ``ACCESS EXCLUSIVE`` lock on the table (a
catalog change: no rows are read or written), bounded by ``PARTITION_LOCK_TIMEOUT``: a
pass that cannot take it in time leaves the partition to the next pass instead of
holding up claims behind its wait. Dropping the detached table then locks only it.
(``DETACH … CONCURRENTLY`` would take a weaker lock, but PostgreSQL refuses it on a
table with a default partition, which keeps an outcome from failing for want of a
partition.)
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Sequence

from django.db import DatabaseError, connections, models, router, transaction

from .. import conf
from ..handler import Handler, seconds
from ..runtime.logs import extra
from ..sql import partitions as sql
from ..states import FINAL_STATES

logger = logging.getLogger("django_dbworker.retention")

#: A partition's statement may run this many times ``PARTITION_LOCK_TIMEOUT`` (its wait
#: for the lock included) before it gives up and leaves the partition to the next pass.
HOLD = 3


def drop_age(handlers: Sequence[Handler], model: type[models.Model]) -> float | None:
    """Seconds after its day's end when a day partition of ``model`` goes: the longest
    retention of its handlers, if each of them has one for every final state (None:
    some finished job is kept for ever, so no partition is dropped)."""
    ages: list[float] = []
    for handler in handlers:
        if handler.model is not model:
            continue
        retention = {str(k): v for k, v in (handler.retention or {}).items()}
        for state in FINAL_STATES:
            if str(state) not in retention:
                return None
            ages.append(float(seconds(retention[str(state)]) or 0.0))
    return max(ages) if ages else None


class DayPartitions:
    """The partitioned job models of ``handlers`` and what each pass does to them."""

    def __init__(self, handlers: Sequence[Handler]) -> None:
        self.models: dict[type[models.Model], float | None] = {}
        for handler in handlers:
            model = handler.model
            if model is not None and model not in self.models and sql.is_partitioned_model(model):
                self.models[model] = drop_age(handlers, model)

        #: When each warning was last said (once an hour).
        self._last: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self.models)

    def _alias(self, model: type[models.Model]) -> str | None:
        alias = router.db_for_write(model)
        return alias if connections[alias].vendor == "postgresql" else None

    def run_once(self, now: datetime.datetime | None = None) -> dict[str, list[str]]:
        """Make the partitions ahead and drop those past retention; the partitions
        dropped, per model label."""
        now = now or datetime.datetime.now(datetime.UTC)
        dropped: dict[str, list[str]] = {}
        for model, age in self.models.items():
            alias = self._alias(model)
            if alias is None:
                continue
            table = model._meta.db_table
            with connections[alias].cursor() as cursor:
                if not sql.is_partitioned(cursor, table):
                    continue  # not migrated yet (PartitionJobTable)
                present = sql.partitions(cursor, table)
            self.make_ahead(alias, table, present, now.date())
            if age is not None:
                gone = self.drop_due(alias, table, present, now - datetime.timedelta(seconds=age))
                if gone:
                    dropped[model._meta.label] = gone
        return dropped

    def make_ahead(
        self, alias: str, table: str, present: Sequence[sql.Partition], today: datetime.date
    ) -> list[datetime.date]:
        days = {p.day for p in present}
        made = []
        for day in sql.days_to_make(today, int(conf.get("PARTITIONS_AHEAD"))):
            if day in days:
                continue
            try:
                self._locked(alias, sql.create_day(table, day))
            except DatabaseError as exc:
                # The lock not taken in time, or the default partition holds rows of
                # that day (they stay there: retention deletes them row by row).
                self._said(f"{table}: partition of {day} not made now: {exc}", "partition_wait")
                continue
            made.append(day)
        return made

    def drop_due(
        self, alias: str, table: str, present: Sequence[sql.Partition], before: datetime.datetime
    ) -> list[str]:
        """Detach and drop the day partitions that ended before ``before``, and the
        legacy partition once retention has emptied it."""
        gone = []
        legacy = sql.partition_name(table, "_legacy")
        for partition in present:
            if partition.name == legacy:  # a converted table's: it goes once emptied
                with connections[alias].cursor() as cursor:
                    cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {sql.quote(legacy)})")
                    if cursor.fetchone()[0]:
                        continue
            elif partition.day is None or before < datetime.datetime.combine(
                partition.day + datetime.timedelta(days=1), datetime.time(), datetime.UTC
            ):
                continue
            started = time.monotonic()
            try:
                self._locked(alias, sql.detach(table, partition.name))
            except DatabaseError as exc:
                self._said(f"{table}: {partition.name} not detached now: {exc}", "partition_wait")
                continue
            locked = time.monotonic() - started
            with connections[alias].cursor() as cursor:
                cursor.execute(sql.drop(partition.name))
            gone.append(partition.name)
            logger.info(
                "%s: dropped partition %s (its jobs past retention; table locked %.3fs)",
                table,
                partition.name,
                locked,
                extra=extra("partition_dropped", table=table, partition=partition.name),
            )
        return gone

    def row_tables(self, model: type[models.Model], alias: str) -> list[str] | None:
        """The partitions of ``model`` whose rows retention deletes one by one (all but
        the day partitions, which go whole); None: not a partitioned table, or its
        partitions are never dropped (every row is deleted as on any table)."""
        if self.models.get(model) is None or connections[alias].vendor != "postgresql":
            return None
        with connections[alias].cursor() as cursor:
            if not sql.is_partitioned(cursor, model._meta.db_table):
                return None
            return [p.name for p in sql.partitions(cursor, model._meta.db_table) if p.day is None]

    def _locked(self, alias: str, statement: str) -> None:
        """``statement`` in a transaction that waits ``PARTITION_LOCK_TIMEOUT`` at most
        for its locks, and runs ``HOLD`` times as long at most once it has them (making
        a partition reads the default partition under the table's lock: one that grew
        large would hold the claims up for as long)."""
        timeout = float(conf.get("PARTITION_LOCK_TIMEOUT"))
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute(sql.lock_timeout(timeout))
            cursor.execute(sql.statement_timeout(timeout * HOLD))
            cursor.execute(statement)

    def _said(self, text: str, event: str) -> None:
        """Log ``text`` once an hour at most."""
        if time.monotonic() - self._last.get(text, -3600.0) < 3600.0:
            return
        self._last[text] = time.monotonic()
        logger.warning("%s", " ".join(text.split()), extra=extra(event))
