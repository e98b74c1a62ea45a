"""Who runs which consumer: the leader's deterministic assignment, and starting and
stopping under the fence.

Live workers are the rows of the worker registry (``WorkerProcess``) whose heartbeat
is younger than ``DBWORKER["CONSUMER_LEASE"]``; a worker declares the consumers it
can run as ``consumer:<name>`` labels in its ``handlers``. Every
``CONSUMER_REBALANCE_INTERVAL`` each worker tries to lead, in a transaction holding
the lock ``(LOCK_CLASS, LEADER_KEY)`` (not waited for: one leader per round;
``sql.consumers.leading``: PostgreSQL's advisory lock, MariaDB's named lock); on
SQLite one process may run consumers (the single-process rule: a worker there
always leads). The leader balances each consumer among the live
workers that declare it (``assign``: no worker runs two more consumers than another
that could take one of them, with the fewest moves); a changed owner bumps the row's
``generation``.

A worker starts a consumer assigned to it only when nobody runs it
(``running_by`` empty, itself, or a worker whose heartbeat is older than the lease),
in one guarded UPDATE; it stops consumers no longer assigned to it and clears
``running_by``. Every batch re-checks owner, generation and ``running_by`` while it
holds the row (``batch``), so two processes never run batches of one consumer at
once.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence

from django.db.models import F, Q
from django.utils import timezone

from ..models import WorkerProcess
from ..sql.consumers import leading
from ..sql.mysql_session import UTCNow
from .consumer import Consumer
from .models import ConsumerCheckpoint

#: The advisory-lock class of consumer leadership (``sql.limits`` uses 0x64627721).
LOCK_CLASS = 0x64627763  # "dbwc"
LEADER_KEY = 1
#: How long the leader's changes wait for a checkpoint row a running batch holds (s).
LEADER_LOCK_WAIT = 5.0
LABEL_PREFIX = "consumer:"


def assign(
    names: Iterable[str],
    capable: Mapping[str, Sequence[str]],
    current: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Consumer name → worker id, balanced over the workers able to run each
    (``capable``: name → live worker ids); names nobody can run are left out.

    Each consumer keeps its ``current`` owner if that worker can still run it; the
    others go, those with the fewest candidates first, to their least loaded candidate.
    Then, while a consumer's worker runs at least two more consumers than another
    worker able to run it, one such consumer moves (the widest gap first). So every
    consumer ends on a worker at most one consumer busier than any of its other
    candidates (a worker declaring a subset gets its share), with the fewest moves
    (each bumps a generation), and a round repeated on the same registry moves nothing.
    """
    current = current or {}
    candidates = {name: sorted(set(capable.get(name, ()))) for name in names}
    load = {worker: 0 for workers in candidates.values() for worker in workers}
    result: dict[str, str] = {}
    for name, workers in candidates.items():
        if current.get(name) in workers:
            result[name] = current[name]
            load[current[name]] += 1
    for name in sorted(candidates, key=lambda n: (len(candidates[n]), n)):
        workers = candidates[name]
        if workers and name not in result:
            result[name] = min(workers, key=lambda w: (load[w], w))
            load[result[name]] += 1
    while True:
        moves = [
            (load[result[name]] - load[other], name, other)
            for name in sorted(result)
            for other in candidates[name]
            if load[result[name]] - load[other] >= 2
        ]
        if not moves:
            return result
        _, name, other = min(moves, key=lambda m: (-m[0], m[1], m[2]))
        load[result[name]] -= 1
        load[other] += 1
        result[name] = other


def live_workers(alias: str, lease: float) -> dict[str, list[str]]:
    """Consumer name → ids of live workers that declare it."""
    rows = (
        WorkerProcess.objects.using(alias)
        .filter(last_heartbeat_at__gte=UTCNow() - datetime.timedelta(seconds=lease))
        .values_list("worker_id", "handlers")
    )
    capable: dict[str, list[str]] = {}
    for worker_id, handlers in rows:
        for label in handlers or []:
            if isinstance(label, str) and label.startswith(LABEL_PREFIX):
                capable.setdefault(label[len(LABEL_PREFIX) :], []).append(worker_id)
    return capable


def rebalance(alias: str, lease: float) -> dict[str, str] | None:
    """Lead one round if no other worker does: reassign; the changed assignments
    (None: another worker leads now)."""
    with leading(alias, (LOCK_CLASS, LEADER_KEY), LEADER_LOCK_WAIT) as leads:
        if not leads:
            return None
        capable = live_workers(alias, lease)
        rows = dict(ConsumerCheckpoint.objects.using(alias).values_list("name", "owner"))
        wanted = assign(rows, capable, rows)
        changed = {}
        for name, owner in rows.items():
            target = wanted.get(name, "")
            if target != owner:
                ConsumerCheckpoint.objects.using(alias).filter(name=name).update(
                    owner=target, generation=F("generation") + 1, updated_at=UTCNow()
                )
                changed[name] = target
        return changed


def owned(alias: str, worker_id: str) -> dict[str, int]:
    """Name → generation of the consumers assigned to ``worker_id``."""
    return dict(
        ConsumerCheckpoint.objects.using(alias)
        .filter(owner=worker_id)
        .values_list("name", "generation")
    )


def try_start(
    alias: str, consumer: Consumer, worker_id: str, generation: int, lease: float
) -> bool:
    """Take ``running_by`` of a consumer assigned to us if nobody live runs it, and name
    its table in the row (what readers take the head from)."""
    live = WorkerProcess.objects.using(alias).filter(
        last_heartbeat_at__gte=UTCNow() - datetime.timedelta(seconds=lease)
    )
    free = (
        Q(running_by="")
        | Q(running_by=worker_id)
        | ~Q(running_by__in=live.exclude(worker_id=worker_id).values("worker_id"))
    )
    return bool(
        ConsumerCheckpoint.objects.using(alias)
        .filter(free, name=consumer.name, owner=worker_id, generation=generation)
        .update(running_by=worker_id, updated_at=UTCNow(), **source_fields(consumer))
    )


def release(alias: str, name: str, worker_id: str) -> None:
    ConsumerCheckpoint.objects.using(alias).filter(name=name, running_by=worker_id).update(
        running_by=""
    )


def source_fields(consumer: Consumer) -> dict[str, str]:
    assert consumer.model is not None
    return {"source": consumer.model._meta.label, "position_field": consumer.position_field}


def ensure_rows(alias: str, consumers: Sequence[Consumer]) -> list[str]:
    """A checkpoint row per consumer, created at its ``start_position`` if missing (as
    caught up then: a new consumer is behind from its creation); the names created."""
    names = [c.name for c in consumers]
    existing = set(
        ConsumerCheckpoint.objects.using(alias)
        .filter(name__in=names)
        .values_list("name", flat=True)
    )
    missing = [c for c in consumers if c.name not in existing]
    if not missing:
        return []
    now = timezone.now()
    ConsumerCheckpoint.objects.using(alias).bulk_create(
        [
            ConsumerCheckpoint(
                name=c.name, position=c.start_position, caught_up_at=now, **source_fields(c)
            )
            for c in missing
        ],
        ignore_conflicts=True,
    )
    return [c.name for c in missing]
