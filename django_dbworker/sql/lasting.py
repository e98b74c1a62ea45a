"""Connection errors that waiting cannot fix: a database that does not exist, a role
or password the server refuses, a SQLite file in a directory that does not exist.

A worker that starts while its database is down waits for it (``runworker
--startup-timeout``); one whose settings name a database it can never open fails at
once, with the server's reason, instead of retrying for a minute as "unreachable".
A server that refuses connections, a name that does not resolve yet, a database
starting up or shutting down, too many connections: all may pass, so they are waited
for.
"""

from __future__ import annotations

import os
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

#: PostgreSQL's SQLSTATEs of a connection refused for good: invalid_catalog_name,
#: invalid_password, invalid_authorization_specification (an unknown role, no
#: pg_hba.conf entry for the client).
POSTGRESQL_STATES = {
    "3D000": "the database does not exist",
    "28P01": "the server refuses the password",
    "28000": "the server refuses the role",
}

#: The same, as libpq's messages say it (psycopg has no SQLSTATE for an error while
#: connecting): a server with ``lc_messages`` in another language is waited for.
POSTGRESQL_MESSAGES = {
    "does not exist": None,  # database "x" / role "x": named by the text below
    "password authentication failed": "the server refuses the password",
    "no pg_hba.conf entry": "the server's pg_hba.conf has no entry for this client",
    "authentication failed for user": "the server refuses the role",
    "no password supplied": "the server wants a password and none is set",
}

#: MariaDB's (and MySQL's) error codes of a connection refused for good:
#: ER_BAD_DB_ERROR, ER_ACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR.
MARIADB_CODES = {
    1049: "the database does not exist",
    1045: "the server refuses the user or password",
    1044: "the user may not use the database",
}


def lasting_problem(exc: BaseException, connection: BaseDatabaseWrapper) -> str | None:
    """Why ``exc`` (raised while connecting to ``connection``'s database) will not pass
    by waiting, or None when it may."""
    errors = [exc, exc.__cause__] if exc.__cause__ is not None else [exc]
    vendor = connection.vendor
    for error in errors:
        if vendor == "postgresql":
            found = _postgresql(error)
        elif vendor == "mysql":
            found = _mariadb(error)
        elif vendor == "sqlite":
            found = _sqlite(error, connection.settings_dict)
        else:
            found = None
        if found:
            return found
    return None


def _postgresql(error: BaseException) -> str | None:
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    if state in POSTGRESQL_STATES:
        return POSTGRESQL_STATES[state]
    text = str(error)
    if "FATAL:" not in text and "fe_sendauth" not in text:
        return None  # not the server's (nor libpq's) refusal: a network error, say
    for needle, why in POSTGRESQL_MESSAGES.items():
        if needle in text:
            if why is None:
                what = "database" if 'database "' in text else "role"
                return f"the {what} does not exist"
            return why
    return None


def _mariadb(error: BaseException) -> str | None:
    args: tuple[Any, ...] = getattr(error, "args", ())
    code = args[0] if args else None
    return MARIADB_CODES.get(code) if isinstance(code, int) else None


def _sqlite(error: BaseException, settings: dict[str, Any]) -> str | None:
    if "unable to open database file" not in str(error):
        return None
    name = str(settings.get("NAME") or "")
    if name.startswith("file:") or name in ("", ":memory:"):
        return None
    folder = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(folder):
        return f"the directory {folder} of its file does not exist"
    return None
