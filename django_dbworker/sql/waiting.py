"""Waiting-only unique keys: the statements that keep them when a job comes back.

A key of ``unique_job_constraint(states=["queued"])`` (or ``["queued", "errored"]``)
is held while a job waits, not while it runs: a worker's claim lets go of it, and
another job with the same key can be enqueued meanwhile (gocraft/work's unique jobs).
The engine moves a running job back to waiting without asking for its key (the
resetter, a requeue at shutdown or of a claim whose reply was lost, a retry after an
error). When another job waits with that key, the returning job is *superseded*: it
ends ``canceled``, its failure message (and its ``history`` entry) naming the job that
holds the key. The rule: **the waiting job keeps the key; a job coming back never
takes it from it**.

Each statement that moves a job back to waiting carries a guard (``guard``): it
leaves out the rows whose key another job holds, so one such row never fails the
statement for the others. Those rows, and the rows of one key that the same
statement would move back together (the first one keeps the key), are handled one at
a time by ``sql.superseding``, where a unique violation (an insert of the key that
committed after the guard looked) fails one row's statement only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import models

from ..states import JobState
from .dialects import Dialect

QUEUED, ERRORED = str(JobState.QUEUED), str(JobState.ERRORED)


def condition_states(constraint: Any) -> frozenset[str] | None:
    """The states a unique key of ``unique_job_constraint`` is held in (its condition,
    ``state__in``); None without such a condition (held in every state)."""
    if not isinstance(constraint, models.UniqueConstraint) or not constraint.fields:
        return None
    condition = constraint.condition
    if not isinstance(condition, models.Q) or condition.negated or len(condition.children) != 1:
        return None
    child = condition.children[0]
    if not isinstance(child, tuple) or child[0] not in ("state__in", "state"):
        return None
    values = child[1] if child[0] == "state__in" else [child[1]]
    return frozenset(str(v) for v in values)


def waiting_states(constraint: Any) -> frozenset[str] | None:
    """The states a waiting-only key is held in (queued, maybe errored, not
    processing): None for any other constraint (an active key, ``states=None``, a
    constraint not made by ``unique_job_constraint``)."""
    states = condition_states(constraint)
    if states is None or QUEUED not in states or not states <= {QUEUED, ERRORED}:
        return None
    return states


@dataclass(frozen=True)
class WaitingKey:
    name: str
    columns: tuple[str, ...]  # quoted
    states: frozenset[str]


class WaitingKeys:
    """The waiting-only keys of one job model, and the SQL that keeps them."""

    def __init__(
        self,
        model: type[models.Model],
        dialect: Dialect,
        table: str,
        col: dict[str, str],
        in_ids: Callable[[str], str],
    ) -> None:
        self.dialect, self.table, self.col, self._in_ids = dialect, table, col, in_ids
        meta = model._meta
        self.keys = [
            WaitingKey(c.name, tuple(col[meta.get_field(f).name] for f in c.fields), s)
            for c in meta.constraints
            if isinstance(c, models.UniqueConstraint) and (s := waiting_states(c)) is not None
        ]

    def __bool__(self) -> bool:
        return bool(self.keys)

    def into(self, state: str) -> list[WaitingKey]:
        """The keys a job moving into ``state`` takes."""
        return [key for key in self.keys if state in key.states]

    def _held(self, key: WaitingKey, this: str, other: str = "dbw_o") -> str:
        states = ", ".join(f"'{s}'" for s in sorted(key.states))
        held = f"{other}.{self.col['state']} IN ({states})"
        same = self.dialect.same_unique_key(key.name, key.columns, other, this, held)
        return f"{same} AND {other}.{self.col['pk']} <> {this}.{self.col['pk']}"

    def held(self, state: str, this: str) -> str:
        """SQL: another job holds a key that row ``this`` (a table name or alias) would
        take in ``state``. Empty when it would take none."""
        return " OR ".join(
            f"EXISTS (SELECT 1 FROM {self.table} AS dbw_o WHERE {self._held(key, this)})"
            for key in self.into(state)
        )

    def guard(self, state: str, this: str) -> str:
        """`` AND …``: row ``this`` may move into ``state``: no other job holds a key it
        would take there. Empty when it takes none."""
        held = self.held(state, this)
        return f" AND NOT ({held})" if held else ""

    def holders(self, key: WaitingKey) -> str:
        """ids → (pk, holder's pk) of each given row whose ``key`` another job holds."""
        pk = self.col["pk"]
        return (
            f"SELECT dbw_r.{pk}, dbw_o.{pk} FROM {self.table} AS dbw_r "
            f"JOIN {self.table} AS dbw_o ON {self._held(key, 'dbw_r')} "
            f"WHERE dbw_r.{pk} {self._in_ids('ids')} ORDER BY dbw_r.{pk}, dbw_o.{pk}"
        )


#: How the failure message of a superseded job begins.
SUPERSEDED = "superseded by job "


def superseded_message(holder: Any, key: str, what: str | None) -> str:
    """The failure message of a job superseded by ``holder``."""
    message = f"{SUPERSEDED}{holder}, which waits with the same unique key ({key})"
    return f"{message}; {what}" if what else message


def superseded(message: str) -> bool:
    """Whether ``message`` (a failure message, a ``history`` entry's) is a superseded
    job's: what an outcome whose reply was lost may have become (``Completer.landed``)."""
    return message.startswith(SUPERSEDED)
