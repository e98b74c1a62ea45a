"""The waiting hub's connection to one database: LISTEN where it can (see
``django_dbworker.waiting``)."""

from __future__ import annotations

import logging
import uuid

from ..sql.connection import Connection
from ..sql.notify import enabled, listen_alias, listen_alias_set

logger = logging.getLogger("django_dbworker.waiting")

#: The channel of the outcome NOTIFYs (payload: the job table's name).
CHANNEL = "dbworker_done"
#: The hub's ``application_name``: what workers look for before they NOTIFY.
SESSION_NAME = "dbworker waiting"
#: Seconds between two polls without LISTEN (SQLite, MariaDB, a pooler).
POLL = 0.25
#: A payload's most bytes (PostgreSQL's limit is 8,000).
MAX_PAYLOAD = 7900
#: The final states as a payload spells them.
CODES = {"completed": "c", "failed": "f", "canceled": "x"}
STATES = {code: state for state, code in CODES.items()}


def payload(table: str, ended: list[tuple[object, str]]) -> str:
    """What a worker NOTIFYs for the jobs of ``table`` one statement ended ((pk, final
    state) each): ``<table><TAB><pk>=<c|f|x>;…`` when every key is an integer or a UUID
    and it fits, so the hub needs no query; else the table's name (the hub reads)."""
    if all(isinstance(pk, int | uuid.UUID) and not isinstance(pk, bool) for pk, _ in ended):
        text = f"{table}\t" + ";".join(f"{pk}={CODES[state]}" for pk, state in ended)
        if len(text.encode()) <= MAX_PAYLOAD:
            return text
    return table


def parse(text: str) -> tuple[str, dict[str, str] | None]:
    """(table, {str(pk): final state}, or None: read them) of a payload."""
    table, _, body = text.partition("\t")
    if not body:
        return table, None
    ended = {}
    for item in body.split(";"):
        pk, _, code = item.partition("=")
        state = STATES.get(code)
        if state is None:
            return table, None
        ended[pk] = state
    return table, ended


class _Link:
    """The hub's connection to one database, LISTENing where it can."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.listening = False
        self.conn: Connection | None = None
        self.failed_at = 0.0

    def connect(self) -> Connection:
        if self.conn is not None:
            return self.conn
        through = self.alias
        listen = enabled(self.alias)
        if listen:
            through = listen_alias(self.alias)
        conn = Connection(through, "waiting")
        try:
            if listen:
                raw = conn._raw()
                if conn.pooled and not listen_alias_set(self.alias):
                    _say_once(
                        f"waiting on database {self.alias!r} polls every {POLL:g}s: it is "
                        "reached through a connection pooler, and LISTEN needs a session of "
                        "its own (set DBWORKER['LISTEN_DATABASE'])"
                    )
                else:
                    with raw.cursor() as cursor:
                        cursor.execute(f"SET application_name = '{SESSION_NAME}'")
                        cursor.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
            else:
                conn.execute("SELECT 1")
        except Exception:
            conn.close()
            self.listening = False
            raise
        self.conn = conn
        return conn

    def fileno(self) -> int | None:
        if not self.listening or self.conn is None or self.conn._wrapper is None:
            return None
        raw = self.conn._wrapper.connection
        return None if raw is None else int(raw.fileno())

    def notified(self) -> set[str]:
        """The payloads of the NOTIFYs that arrived (non-blocking)."""
        if not self.listening or self.conn is None or self.conn._wrapper is None:
            return set()
        raw = self.conn._wrapper.connection
        return {note.payload for note in raw.notifies(timeout=0)}

    def close(self) -> None:
        conn, self.conn = self.conn, None
        self.listening = False
        if conn is not None:
            conn.close()


_said: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        logger.warning(text, extra={"action": "waiting_polls"})
