"""Small MySQLdb helpers for the harness's MariaDB system, as ``pg`` is for
PostgreSQL. DSNs are ``mysql://user[:password]@host:port/name``. MySQLdb (mysqlclient,
the ``mysql`` dependency group) is imported on the first connection: the harness runs
without it when no MariaDB system is asked for."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit


def connect(dsn: str, database: bool = True) -> Any:
    import MySQLdb

    parts = urlsplit(dsn)
    kwargs: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
        "autocommit": True,
    }
    if database:
        kwargs["database"] = parts.path.lstrip("/")
    return MySQLdb.connect(**kwargs)


def execute(dsn: str, *queries: str) -> list[tuple[Any, ...]]:
    """Run ``queries`` in one session; the rows of the last."""
    conn = connect(dsn)
    try:
        cursor = conn.cursor()
        for query in queries:
            cursor.execute(query)
        return list(cursor.fetchall()) if cursor.description else []
    finally:
        conn.close()


def recreate_database(dsn: str) -> None:
    name = urlsplit(dsn).path.lstrip("/")
    conn = connect(dsn, database=False)
    try:
        cursor = conn.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def status(dsn: str, name: str) -> int:
    """A counter of ``SHOW GLOBAL STATUS`` (the server's, all databases)."""
    [(_, value)] = execute(dsn, f"SHOW GLOBAL STATUS LIKE '{name}'")
    return int(value)


class RedoCounter:
    """InnoDB's redo log bytes a drain wrote (``Innodb_os_log_written``): the server's
    whole log, not the job table's alone, so a quiet server is needed (the PostgreSQL
    figure, by ``pg_walinspect``, counts the tables' records only)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.start = status(dsn, "Innodb_os_log_written")

    def bytes(self) -> dict[str, int]:
        return {"redo": status(self.dsn, "Innodb_os_log_written") - self.start}
