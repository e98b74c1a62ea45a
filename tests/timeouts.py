"""A test that pytest-timeout stops must not fail the next one (a pytest plugin:
``tests/conftest.py`` takes its hook; ``-p tests.timeouts`` loads it elsewhere).

pytest-timeout's ``signal`` method (pyproject.toml) raises its ``Failed`` exception in
the test's own thread, wherever the test is, so the fixtures' teardown still runs
(workers stopped, subprocesses killed, the database flushed). But psycopg cancels a
query it is waiting for on ``KeyboardInterrupt`` and ``SystemExit`` only: any other
exception leaves the connection mid-query, and pytest-django's flush after the test,
then the next test on that connection, fail with "another command is already in
progress". So after a phase that timed out, every Django connection of this process
has its command in flight cancelled on the server and is closed: the teardown and the
next test open fresh ones."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

#: How pytest-timeout's message ends ("Timeout (>300.0s) from pytest-timeout.").
MESSAGE = "from pytest-timeout"


def timed_out(call: pytest.CallInfo[Any]) -> bool:
    """Whether pytest-timeout stopped this phase of the test."""
    excinfo = call.excinfo
    return (
        excinfo is not None
        and excinfo.errisinstance(pytest.fail.Exception)
        and MESSAGE in str(excinfo.value)
    )


def reset_connections() -> list[str]:
    """Cancel what each open Django connection of this thread is running, and close it;
    the aliases reset."""
    from django.db import connections

    reset = []
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None:
            continue
        if conn.vendor == "postgresql":
            from psycopg import pq

            if raw.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
                with contextlib.suppress(Exception):
                    raw.cancel_safe(timeout=5.0)
        with contextlib.suppress(Exception):
            conn.close()
        reset.append(conn.alias)
    return reset


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    yield
    if timed_out(call):
        reset_connections()
