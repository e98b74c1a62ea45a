"""Jobs back to waiting, with waiting-only unique keys kept (``sql.waiting``).

The worker's requeues (at shutdown, of a claim whose reply was lost), its retry after
an error and the resetter's reset run through here. For a model without waiting-only
keys each is its one statement, as before. With them, each statement's guard leaves
out the rows whose key another job holds; then:

- if the statement failed on a unique key anyway (rows of one key moving back
  together, or an insert of the key that committed after the guard looked), it runs
  again one row at a time, in key order, so that the first row of a key keeps it and
  a failure is one row's;
- each row left out whose key another job holds is *superseded*: ``canceled``, its
  failure message and ``history`` entry naming the job that holds the key and saying
  what the attempt was (``superseded_message``);
- a row left out whose holder went meanwhile is tried again (``ROUNDS`` in all):
  after that it stays the worker's, and its outcome is written later (the writer
  retries locked rows) or the resetter takes it, as any outcome that could not land.

Every statement is fenced as the one it stands for: a superseding never touches a
row that is no longer this attempt's (or no longer stalled).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import IntegrityError, transaction

from ..states import JobState
from .connection import Runner
from .jobs import JobStatements
from .waiting import superseded_message

QUEUED, ERRORED, CANCELED = (
    JobState.QUEUED.value,
    JobState.ERRORED.value,
    JobState.CANCELED.value,
)
#: Times a row is tried (moved back, or superseded) before the statements ask whether
#: it is still this worker's at all; then up to ``MAX_ROUNDS`` while it is (each
#: round that fails means another job took the key, or the holder was claimed).
ROUNDS = 3
MAX_ROUNDS = 50
#: What the resetter's superseding says the attempt was.
RESET_WHAT = "reset: its worker stopped heartbeating"

Rows = list[tuple[Any, ...]]


def attempt(conn: Runner, sql: str, params: Mapping[str, Any]) -> Rows | None:
    """Run ``sql``; None if it failed on a unique key (only it failed: on Django's
    connection, inside the caller's transaction, it runs in a savepoint)."""
    errors: tuple[type[BaseException], ...] = (IntegrityError,)
    database = getattr(conn.wrapper, "Database", None)
    if database is not None and hasattr(database, "IntegrityError"):
        errors += (database.IntegrityError,)
    try:
        if getattr(conn, "role", None) == "django":
            with transaction.atomic(using=conn.alias):
                return conn.execute(sql, params)
        return conn.execute(sql, params)
    except errors:
        return None


def holders(
    conn: Runner, stmts: JobStatements, pks: Sequence[Any], state: str
) -> dict[Any, tuple[Any, str]]:
    """(holder's key, constraint name) of each of ``pks`` whose key in ``state``
    another job holds (the lowest key of those, for the first key that is held)."""
    found: dict[Any, tuple[Any, str]] = {}
    for key in stmts.waiting.into(state):
        left = [pk for pk in pks if pk not in found]
        if not left:
            break
        for pk, holder in conn.execute(stmts.waiting.holders(key), {"ids": stmts.ids_param(left)}):
            found.setdefault(stmts.key(pk), (stmts.key(holder), key.name))
    return found


def _ours(conn: Runner, stmts: JobStatements, keys: Sequence[Any], worker: str) -> list[Any]:
    """The rows of ``keys`` still this worker's attempts (``processing``, its id)."""
    rows = conn.execute(stmts.still_held, {"ids": stmts.ids_param(list(keys)), "worker": worker})
    asked = set(keys)
    return [pk for pk in stmts.keys(rows) if pk in asked]


def _supersede(
    conn: Runner,
    stmts: JobStatements,
    pks: Sequence[Any],
    state: str,
    what: str | None,
    run: Callable[[Any, str], Rows],
    notes: dict[Any, str] | None,
) -> dict[Any, str]:
    """Supersede each of ``pks`` whose key another job holds: ``run(pk, message)``
    writes it (fenced). The states written; ``notes`` gets each one's message."""
    done: dict[Any, str] = {}
    for pk, (holder, name) in holders(conn, stmts, pks, state).items():
        message = superseded_message(holder, name, what)
        if run(pk, message):
            done[pk] = CANCELED
            if notes is not None:
                notes[pk] = message
    return done


def requeue(
    conn: Runner,
    stmts: JobStatements,
    ids: Sequence[Any],
    worker: str,
    message: str | None,
    notes: dict[Any, str] | None = None,
) -> dict[Any, str]:
    """``requeue`` of this worker's rows ``ids``: the state each row took (queued, or
    canceled: superseded, its failure message in ``notes``)."""
    params = {"worker": worker, "message": message}

    def move(keys: Sequence[Any]) -> Rows | None:
        return attempt(conn, stmts.requeue, {**params, "ids": stmts.ids_param(list(keys))})

    if not stmts.waiting:
        done = conn.execute(stmts.requeue, {**params, "ids": stmts.ids_param(list(ids))})
        return dict.fromkeys(stmts.keys(done), QUEUED)
    rows = move(ids)

    def supersede(pk: Any, text: str) -> Rows:
        return conn.execute(stmts.supersede, {**params, "message": text, "pk": stmts.key_param(pk)})

    states: dict[Any, str] = {}
    left = list(ids)
    for tries in range(MAX_ROUNDS):
        if rows is None:  # one row at a time: the first row of a key keeps it
            rows = []
            for pk in sorted(left):
                rows += move([pk]) or []
        states.update(dict.fromkeys(stmts.keys(rows), QUEUED))
        left = [pk for pk in left if pk not in states]
        if not left:
            break
        states.update(_supersede(conn, stmts, left, QUEUED, message, supersede, notes))
        left = [pk for pk in left if pk not in states]
        if left and tries >= ROUNDS - 1:
            left = _ours(conn, stmts, left, worker)  # the others: lost (or locked)
        if not left:
            break
        rows = move(left)
    return states


def requeue_unheld(
    conn: Runner,
    stmts: JobStatements,
    worker: str,
    held: Sequence[Any],
    message: str,
    notes: dict[Any, str] | None = None,
) -> dict[Any, str]:
    """``requeue_unheld``: the state each row took (queued, or canceled: superseded)."""
    params = {"worker": worker, "held": stmts.ids_param(list(held)), "message": message}
    if not stmts.waiting:
        return dict.fromkeys(stmts.keys(conn.execute(stmts.requeue_unheld, params)), QUEUED)
    states = dict.fromkeys(stmts.keys(attempt(conn, stmts.requeue_unheld, params) or []), QUEUED)
    left = stmts.keys(conn.execute(stmts.unheld_ids, params))
    if left:
        states.update(requeue(conn, stmts, left, worker, message, notes))
    return states


def error(
    conn: Runner,
    stmts: JobStatements,
    sql: str,
    params: dict[str, Any],
    notes: dict[Any, str] | None = None,
) -> Rows:
    """The ``error`` statement ``sql`` (``error`` or ``error_with_history``) of one row:
    [(state written,)], or [] when the row is no longer this attempt's (or locked)."""
    if not stmts.waiting.into(ERRORED):
        return conn.execute(sql, params)
    pk = params["pk"]

    def supersede(key: Any, text: str) -> Rows:
        return conn.execute(stmts.supersede, {**params, "message": text, "pk": pk})

    key = stmts.key(pk)
    for tries in range(MAX_ROUNDS):
        rows = attempt(conn, sql, params)
        if rows:
            return rows
        what = params.get("message")
        if _supersede(conn, stmts, [key], ERRORED, what, supersede, notes):
            return [(CANCELED,)]
        # Nothing written and no holder: the row is not ours any more (or locked), or
        # the job that held its key was claimed meanwhile: try again while it is ours.
        if tries >= ROUNDS - 1 and not _ours(conn, stmts, [key], params["worker"]):
            break
    return []


def reset_stalled(
    conn: Runner,
    stmts: JobStatements,
    params: dict[str, Any],
    notes: dict[Any, str] | None = None,
) -> tuple[Rows, Rows]:
    """``reset_stalled``: (pk, worker) of the rows back in the queue, and of those
    superseded (their messages in ``notes``)."""
    if not stmts.waiting:
        return conn.execute(stmts.reset_stalled, params), []
    rows: Rows | None = attempt(conn, stmts.reset_stalled, params)

    def one(pk: Any) -> Rows:
        return attempt(conn, stmts.reset_one, {**params, "pk": stmts.key_param(pk)}) or []

    superseded: Rows = []

    def supersede(pk: Any, text: str) -> Rows:
        done = conn.execute(
            stmts.supersede_stalled, {**params, "message": text, "pk": stmts.key_param(pk)}
        )
        superseded.extend(done)
        return done

    reset: Rows = []
    for _ in range(ROUNDS):
        if rows is None:  # one row at a time: the first row of a key keeps it
            rows = []
            for pk in sorted(stmts.keys(conn.execute(stmts.resettable_ids, params))):
                rows += one(pk)
        reset += rows
        left = sorted(stmts.keys(conn.execute(stmts.resettable_ids, params)))
        if not left:
            break
        _supersede(conn, stmts, left, QUEUED, RESET_WHAT, supersede, notes)
        rows = None  # the others: their holder was claimed meanwhile, or they are new
    return reset, superseded
