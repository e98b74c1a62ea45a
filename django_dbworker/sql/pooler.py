"""Connection poolers (PgBouncer and the like) in front of PostgreSQL.

A pooler in transaction mode hands each transaction to whichever server
connection is free. Whatever a client leaves on a server session outside a
transaction (``SET``, ``set_config(…, false)``, a ``LISTEN``, a protocol-level
prepared statement) then belongs to the next client of that server connection.

Our private connections (``sql.connection``) tell at connect time whether a
pooler sits in between: PostgreSQL's own backend pid (``pg_backend_pid()``)
differs from the key the connection got at start-up (``BackendKeyData``), which
a pooler makes up for each of its clients. On a direct connection they keep
today's session settings and prepare their statements; through a pooler the
timeouts and the application name are set inside each transaction
(``set_config(…, true)``, gone at its end) and statements are prepared only as
the database's ``OPTIONS["prepare_threshold"]`` (or ``DBWORKER["PREPARED_STATEMENTS"]``)
says.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connections

from .. import conf

logger = logging.getLogger("django_dbworker.db")

#: Run first in each transaction of a connection through a pooler: the application
#: name and, with ``STATEMENT_TIMEOUT``, the statement and lock timeouts, for that
#: transaction only. ``$1``: the name, ``$2``: the timeout (``"10000ms"``).
LOCAL_SETTINGS = (
    "SELECT set_config('application_name', $1, true), "
    "set_config('statement_timeout', $2, true), set_config('lock_timeout', $2, true)"
)
LOCAL_NAME = "SELECT set_config('application_name', $1, true)"
#: A direct connection's settings, once for its session: the same values.
SESSION_SETTINGS = (
    "SELECT set_config('application_name', %s, false), "
    "set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)"
)
SESSION_NAME = "SELECT set_config('application_name', %s, false)"


def server_pid(raw: Any) -> int:
    """The backend pid of the server session the next statement of ``raw`` runs in."""
    with raw.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def behind_pooler(raw: Any, pid: int | None = None) -> bool:
    """Whether ``raw`` (a psycopg connection) reaches PostgreSQL through a pooler: the
    key it got at start-up is not the pid of the server session it talks to."""
    return (server_pid(raw) if pid is None else pid) != int(raw.info.backend_pid)


def prepare_threshold(alias: str, pooled: bool) -> int | None:
    """psycopg's ``prepare_threshold`` for our statements on database ``alias``:
    ``DBWORKER["PREPARED_STATEMENTS"]`` when set (True: at once, False: never); else
    the database's ``OPTIONS["prepare_threshold"]`` when given; else at once on a
    direct connection and never through a pooler (Django's default, which keeps
    PgBouncer < 1.21 in transaction mode working)."""
    setting = conf.get("PREPARED_STATEMENTS")
    if setting is not None:
        return 0 if setting else None
    options = connections[alias].settings_dict.get("OPTIONS") or {}
    if "prepare_threshold" in options:
        value = options["prepare_threshold"]
        return None if value is None else int(value)
    return None if pooled else 0


def timeout_text(seconds: float | None) -> str | None:
    return None if not seconds else f"{int(seconds * 1000)}ms"


def session_settings(raw: Any, name: str, timeout: str | None) -> None:
    """A direct connection's application name and timeouts, for its whole session."""
    with raw.cursor() as cursor:
        if timeout:
            cursor.execute(SESSION_SETTINGS, [name, timeout, timeout])
        else:
            cursor.execute(SESSION_NAME, [name])


def local_prefix(raw: Any, name: str, timeout: str | None) -> str:
    """``local_settings`` as a statement with its values in it, to run before another in
    one query (client-side binding: ``%`` is doubled)."""
    from psycopg import sql

    statement, values = local_settings(name, timeout)
    text = statement.replace("$1", "{0}").replace("$2", "{1}")
    composed = sql.SQL(text).format(*(sql.Literal(value) for value in values))
    return composed.as_string(raw).replace("%", "%%") + "; "


def local_settings(name: str, timeout: str | None) -> tuple[str, list[Any]]:
    """The statement (and its values) that sets a pooled connection's application name
    and timeouts for the transaction it runs in."""
    if timeout:
        return LOCAL_SETTINGS, [name, timeout]
    return LOCAL_NAME, [name]


# -- the pooler's errors ------------------------------------------------------------------

#: SQLSTATEs of a prepared statement that a pooler in transaction mode lost or mixed up:
#: duplicate_prepared_statement, invalid_sql_statement_name; and protocol_violation with
#: "bind message supplies …": a statement bound to another client's prepared statement.
_PREPARED_STATES = {"42P05", "26000"}
_hinted: set[str] = set()
_hinted_lock = threading.Lock()


def is_pooler_error(exc: BaseException) -> bool:
    """Whether ``exc`` is what a pooler that cannot keep prepared statements causes."""
    state = getattr(exc, "sqlstate", None)
    if state in _PREPARED_STATES:
        return True
    return state == "08P01" and "bind message supplies" in str(exc)


def pooler_hint(alias: str) -> str:
    """One line naming the setting that cures a pooler's prepared-statement errors."""
    options = connections[alias].settings_dict.get("OPTIONS") or {}
    if conf.get("PREPARED_STATEMENTS"):
        cure = "set DBWORKER['PREPARED_STATEMENTS'] = False (it is True)"
    elif options.get("prepare_threshold") is not None:
        cure = f"remove OPTIONS['prepare_threshold'] from DATABASES[{alias!r}]"
    else:
        cure = "set DBWORKER['PREPARED_STATEMENTS'] = False"
    return (
        f"database {alias!r}: a connection pooler in transaction mode (PgBouncer < 1.21) "
        f"cannot keep prepared statements: {cure}, or enable the pooler's prepared "
        "statement support (PgBouncer >= 1.21: max_prepared_statements)"
    )


def note_pooler_error(exc: BaseException, alias: str) -> bool:
    """Log the hint once per process and database when ``exc`` is a pooler's
    prepared-statement error; whether it was one."""
    if not is_pooler_error(exc):
        return False
    with _hinted_lock:
        first = alias not in _hinted
        _hinted.add(alias)
    if first:
        logger.error("%s (%s)", pooler_hint(alias), str(exc).strip().splitlines()[0])
    return True
