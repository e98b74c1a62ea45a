"""Small psycopg helpers for the harness (runs in the project's own environment)."""

from __future__ import annotations

import subprocess
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql


def with_db(base: str, name: str) -> str:
    """``base`` (``postgresql://user@host:port``) with database ``name``."""
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def recreate_database(base: str, name: str) -> str:
    """Drop (if there) and create database ``name``; return its DSN."""
    with connect(with_db(base, "postgres")) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_db(base, name)


def one(dsn: str, query: str, params: Any = None) -> Any:
    with connect(dsn) as conn:
        row = conn.execute(query, params).fetchone()
        return row


def execute(dsn: str, *queries: str) -> None:
    with connect(dsn) as conn:
        for query in queries:
            conn.execute(query)


def commits(dsn: str) -> int:
    """Transactions committed in this database so far (pg_stat_database)."""
    with connect(dsn) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0])


def server_info(dsn: str) -> dict[str, Any]:
    with connect(dsn) as conn:
        info: dict[str, Any] = {}
        for name in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "shared_buffers",
            "max_connections",
            "autovacuum",
        ):
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            info[name] = row[0] if row else None
        return info


def pgbench_available() -> bool:
    try:
        subprocess.run(["pgbench", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    return True
