"""Retention: deleting finished jobs once their handler's ``retention`` has passed.

Small batches (``BATCH`` rows per statement, rows another transaction locks
skipped) within a time budget per pass, so pruning a large backlog never holds
long locks or starves claims; a later pass goes on where this one stopped.
Never a queued, errored or processing row: only the states a handler names.

Deleting is what ``QuerySet.delete()`` would do: a job model that other models
reference (a ``ForeignKey`` to it, a many-to-many, a generic relation) or whose
deletion has signal receivers is deleted through Django's collector, so
``on_delete`` holds (CASCADE deletes the dependents, SET_NULL empties them) and
``pre_delete``/``post_delete`` are sent; a row that ``PROTECT``/``RESTRICT``
keeps is passed over (said once per relation). Other job models take one plain
``DELETE`` per batch. A row the database still refuses to delete (a foreign key of
a table Django does not know) is passed over too, and said once: one row never
stalls retention.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models.deletion import PROTECT, RESTRICT, Collector
from django.db.models.signals import post_delete, pre_delete
from django.utils import timezone

from ..handler import Handler, seconds
from ..runtime.logs import extra
from ..sql.connection import Connections
from ..sql.filters import FILTER_ERRORS, compile_filter
from ..sql.jobs import statements_for
from ..states import FINAL_STATES
from .partitions import DayPartitions

logger = logging.getLogger("django_dbworker.retention")

#: Rows one statement deletes at most.
BATCH = 100
#: Seconds one pass may spend deleting.
PASS_BUDGET = 2.0
#: After each batch, rest this many times as long as the batch took.
REST = 1.0


def _references(model: type[models.Model]) -> bool:
    """Whether deleting a row of ``model`` is more than a ``DELETE``: other models'
    foreign keys to it, its many-to-many or generic relations."""
    meta = model._meta
    relations = [*meta.related_objects, *meta.many_to_many]
    return bool(relations or [f for f in meta.private_fields if f.is_relation])


def _protections(model: type[models.Model]) -> list[Any]:
    """Other models' foreign keys to ``model`` that keep a referenced row."""
    keeping = (PROTECT, RESTRICT)
    return [
        rel
        for rel in model._meta.related_objects
        if not rel.many_to_many and getattr(rel, "on_delete", None) in keeping
    ]


def _referenced_by(rel: Any) -> models.Exists:
    """Whether a row of the job model is referenced through ``rel`` (a reverse FK)."""
    field = rel.field
    rows = field.model._base_manager.filter(
        **{field.attname: models.OuterRef(field.target_field.attname)}
    )
    return models.Exists(rows)


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
        #: Rows the database refused to delete, per model: passed over from then on.
        self.refused: dict[type[models.Model], set[Any]] = {}
        #: The PROTECT/RESTRICT relations said to keep rows (once each).
        self._said: set[Any] = set()
        #: Partitioned job tables: their day partitions go whole (``partitions``).
        self.partitions = DayPartitions(handlers)

    def __bool__(self) -> bool:
        return bool(self.rules or self.partitions)

    def close(self) -> None:
        self.conn.close()

    def run_once(
        self, budget: float = PASS_BUDGET, stopping: threading.Event | None = None
    ) -> dict[str, int]:
        """Delete what is due, within ``budget`` seconds (or until ``stopping`` is set);
        how many rows per handler."""
        deadline = time.monotonic() + budget
        deleted: dict[str, int] = {}
        if self.partitions:
            self.partitions.run_once()
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
        signals = pre_delete.has_listeners(model) or post_delete.has_listeners(model)
        tables = self.partitions.row_tables(model, alias) if self.partitions else None
        if tables is not None:  # the day partitions go whole: the others' rows one by one
            total = 0
            for table in tables:
                batch = self._plain_batch(handler, model, alias, state, age, table)
                if batch is None:
                    return 0
                total += self._drain(batch, deadline, stopping)
            return total
        if _references(model) or signals:
            batch = self._collected_batch(handler, model, alias, state, age)
        else:
            batch = self._plain_batch(handler, model, alias, state, age)
            if batch is None:
                return 0  # the handler claims nothing either (dbworker.E004)
        return self._drain(batch, deadline, stopping)

    def _drain(self, batch: Any, deadline: float, stopping: threading.Event) -> int:
        """Run ``batch`` until it deletes less than a batch, the deadline or a stop."""
        total = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            count, full = batch()
            total += count
            if not full:
                break
            # Leave the database to the claims for as long again as the batch took.
            if stopping.wait((time.monotonic() - started) * REST):
                break
        return total

    def _plain_batch(
        self,
        handler: Handler,
        model: type[models.Model],
        alias: str,
        state: str,
        age: float,
        partition: str | None = None,
    ) -> Any:
        """One ``DELETE … RETURNING`` per batch; a batch the database refuses is deleted
        row by row, and the rows it still refuses are passed over. ``partition``: the
        rows of that partition of the table only."""
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
                return None
            if compiled is None:
                return None
            where, params = compiled
        refused = self.refused.setdefault(model, set())
        spared = stmts.not_among("spare")
        where = f"({where}) AND {spared}" if where else spared
        delete, select = stmts.prune(where), stmts.prunable(where)
        prune_one = stmts.prune_one
        if partition is not None:
            quoted = conn.wrapper.ops.quote_name(partition)
            delete, select, prune_one = (
                s.replace(stmts.table, quoted) for s in (delete, select, prune_one)
            )
        # Our connection raises the driver's own exceptions.
        refusal = (IntegrityError, conn.wrapper.Database.IntegrityError)  # type: ignore[attr-defined]

        def batch() -> tuple[int, bool]:
            values = {
                **params,
                "state": state,
                "age": age,
                "batch": BATCH,
                "spare": stmts.ids_param(list(refused)),
            }
            try:
                deleted = len(conn.execute(delete, values))
                return deleted, deleted == BATCH
            except refusal:  # a foreign key Django does not know: one by one
                pks = stmts.keys(conn.execute(select, values))
            deleted = 0
            for pk in pks:
                try:
                    deleted += len(conn.execute(prune_one, {"pk": stmts.key_param(pk)}))
                except refusal as exc:
                    refused.add(pk)
                    self._refused(model, pk, exc)
            return deleted, bool(pks)

        return batch

    def _collected_batch(
        self, handler: Handler, model: type[models.Model], alias: str, state: str, age: float
    ) -> Any:
        """``QuerySet.delete()`` of up to ``BATCH`` rows per batch (rows another
        transaction locks skipped), but rows a PROTECT or RESTRICT foreign key keeps;
        a batch the database refuses is deleted row by row."""
        manager = model._base_manager.using(alias)
        due = manager.filter(state=state, finished_at__lt=timezone.now() - timedelta(seconds=age))
        if handler.dequeue_filter is not None:
            due = due.filter(handler.dequeue_filter)
        candidates = due
        for rel in _protections(model):
            candidates = candidates.exclude(_referenced_by(rel))
        refused = self.refused.setdefault(model, set())
        # Lock the job rows only (MariaDB has no OF: its lock takes what the query joins;
        # the protections above are subqueries, not joins).
        of = ("self",) if connections[alias].features.has_select_for_update_of else ()

        def delete(pks: list[Any]) -> int:
            rows = manager.filter(pk__in=pks)
            collector = Collector(using=alias, origin=rows)
            collector.collect(rows)
            with transaction.atomic(using=alias):  # a savepoint: a refusal undoes this only
                _, per_model = collector.delete()
            return per_model.get(model._meta.label, 0)

        def batch() -> tuple[int, bool]:
            self._say_protected(model, due)
            with transaction.atomic(using=alias):
                pks = list(
                    candidates.exclude(pk__in=refused)
                    .order_by()
                    .select_for_update(skip_locked=True, of=of)
                    .values_list("pk", flat=True)[:BATCH]
                )
                try:
                    return (delete(pks) if pks else 0), len(pks) == BATCH
                except IntegrityError:
                    pass
                deleted = 0
                for pk in pks:
                    try:
                        deleted += delete([pk])
                    except IntegrityError as exc:
                        refused.add(pk)
                        self._refused(model, pk, exc)
                return deleted, True

        return batch

    def _refused(self, model: type[models.Model], pk: Any, exc: Exception) -> None:
        logger.warning(
            "%s: retention passes over job %s, which the database refuses to delete: %s",
            model._meta.label,
            pk,
            " ".join(str(exc).split()),
            extra=extra("retention_kept", model=model._meta.label, job=pk),
        )

    def _say_protected(self, model: type[models.Model], due: Any) -> None:
        """Say once per relation that a due row is kept by a PROTECT/RESTRICT key."""
        for rel in _protections(model):
            if rel in self._said:
                continue
            kept = due.filter(_referenced_by(rel)).values_list("pk", flat=True).first()
            if kept is None:
                continue
            self._said.add(rel)
            logger.warning(
                "%s: retention keeps finished jobs that %s.%s references (on_delete=%s), "
                "e.g. job %s",
                model._meta.label,
                rel.related_model._meta.label,
                rel.field.name,
                rel.on_delete.__name__,
                kept,
                extra=extra("retention_kept", model=model._meta.label),
            )
