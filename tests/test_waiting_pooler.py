"""Waiting behind PgBouncer in transaction mode (issue 44, item 5): LISTEN needs a
session of its own, so the hub's connection to a pooled alias LISTENs through
``DBWORKER["LISTEN_DATABASE"]`` (a direct connection), where the NOTIFYs workers send
through the pooler arrive; without it, it says so once, does not LISTEN, and polls
through the pooler."""

import logging
import time

import psycopg
import pytest

from django_dbworker import waiting
from django_dbworker.waiting import _link
from tests.conftest import test_database_url as database_url
from tests.conftest import wait_until
from tests.test_pooler import (  # noqa: F401 - the fixtures
    database_alias,
    needs_pgbouncer,
    pgbouncer,
    unblocked,
)


@needs_pgbouncer
@pytest.mark.parametrize("listen", [False, True], ids=["polls", "listens-direct"])
def test_the_hub_s_connection_behind_a_transaction_pooler(
    unblocked,  # noqa: F811
    pgbouncer,  # noqa: F811
    settings,
    caplog,
    listen,
):
    bouncer = pgbouncer("transaction")
    _link._said.clear()
    if listen:
        settings.DBWORKER = {"LISTEN_DATABASE": {"pooled": "default"}}
    caplog.set_level(logging.WARNING, "django_dbworker.waiting")
    sender = psycopg.connect(bouncer.url(database_url()), autocommit=True, prepare_threshold=None)
    with database_alias("pooled", bouncer.port) as alias:
        link = _link._Link(alias)
        try:
            conn = link.connect()
            assert link.listening is listen
            assert conn.execute("SELECT 1") == [(1,)]  # its reads work either way
            if listen:
                assert not conn.pooled  # the direct alias
                sender.execute("SELECT pg_notify(%s, %s)", [waiting.CHANNEL, "t\t1=c"])
                got: set[str] = set()
                wait_until(lambda: got.update(link.notified()) or got, 10, message="NOTIFY")
                assert got == {"t\t1=c"}
                [(name,)] = conn.execute("SELECT current_setting('application_name')")
                assert name == waiting.SESSION_NAME  # what workers look for
            else:
                assert conn.pooled
                assert "LISTEN needs a session of its own" in caplog.text
                time.sleep(0.2)
                assert link.notified() == set()
        finally:
            link.close()
            sender.close()
