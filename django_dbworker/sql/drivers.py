"""What each database driver needs of our statements and connections: our placeholders
in its style (PostgreSQL's numbered ones, sqlite3's), SQLite's functions, a wrapper
outside Django's per-thread connections, and how its errors read."""

from __future__ import annotations

import datetime
import functools
import re
import time
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend
from django.utils import timezone

_NAMED = re.compile(r"(?<!%)%\((\w+)\)s")
_QMARK = re.compile(r"(?<!%)%s")


@functools.lru_cache(maxsize=128)
def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with PostgreSQL's own placeholders (``%(name)s`` → ``$1``) and the names
    in their order: what psycopg's ``RawCursor`` runs without parsing the statement
    (psycopg parses, at every execution, a statement longer than 4 KB)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    numbered = _NAMED.sub(number, sql)
    if _QMARK.search(numbered):
        raise ValueError("a statement with positional placeholders")
    return numbered.replace("%%", "%"), tuple(names)


def sqlite_sql(sql: str) -> str:
    """Our placeholders in sqlite3's styles: ``%(name)s`` → ``:name``, ``%s`` → ``?``."""
    return _QMARK.sub("?", _NAMED.sub(r":\1", sql)).replace("%%", "%")


#: A statement that waited this long for SQLite's write lock tells of contention.
SQLITE_LOCK_WAIT = 1.0


def private_wrapper(alias: str) -> BaseDatabaseWrapper:
    """A new database wrapper for ``alias`` outside Django's per-thread connections,
    and outside its connection pool (``OPTIONS["pool"]``): the worker holds these for
    good, and taking them from the pool would starve the handlers' own connections."""
    settings_dict = dict(connections[alias].settings_dict)
    options = dict(settings_dict.get("OPTIONS") or {})
    options.pop("pool", None)
    if connections[alias].vendor == "mysql":
        from . import mysql

        options["conv"] = mysql.conversions(options.get("conv"))
    settings_dict["OPTIONS"] = options
    backend = load_backend(settings_dict["ENGINE"])
    wrapper: BaseDatabaseWrapper = backend.DatabaseWrapper(settings_dict, alias)
    return wrapper


def is_lock_timeout(exc: BaseException) -> bool:
    """SQLite's "database is locked": another connection held the write lock too long."""
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def add_sqlite_functions(wrapper: BaseDatabaseWrapper, raw: Any) -> None:
    """The functions our SQLite statements call: ``dbworker_time(offset)`` (now plus
    ``offset`` seconds, stored as Django stores datetimes) and ``dbworker_epoch()``
    (now in seconds since the epoch). The clock is this machine's, as ``timezone.now()``."""
    adapt = wrapper.ops.adapt_datetimefield_value

    def dbworker_time(offset: float | None) -> Any:
        if offset is None:  # as PostgreSQL's now() + NULL
            return None
        return adapt(timezone.now() + datetime.timedelta(seconds=offset))

    raw.create_function("dbworker_time", 1, dbworker_time)
    raw.create_function("dbworker_epoch", 0, time.time)


def mysql_disconnect(exc: BaseException) -> bool:
    from . import mysql

    return mysql.is_disconnect(exc)
