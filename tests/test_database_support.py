"""What a job database lacks is refused, not left to misbehave: limits (E031), ordered
consumers (E032) and unique jobs (E033) on a database whose dialect lacks them (none
today: a test's dialect); the server itself (E030). On PostgreSQL, SQLite and
MariaDB the same declarations pass the checks."""

import pytest
from django.db import connection

from django_dbworker.checks import check_consumers, validate_handler
from django_dbworker.sql.dialects import dialect_for
from django_dbworker.support import NotSupportedHere, check_servers, missing
from tests.testapp.handlers import BehaviorHandler
from tests.testapp.models import QueueJob

MARIADB = connection.vendor == "mysql"


class LimitedHandler(BehaviorHandler):
    max_concurrency = 2


class RatedHandler(BehaviorHandler):
    rate_limit = "10/s"


class UniqueHandler(BehaviorHandler):
    unique_by = ("payload",)


def ids(messages):
    return sorted({m.id for m in messages if m.id in {"dbworker.E031", "dbworker.E033"}})


@pytest.mark.parametrize("handler", [LimitedHandler, RatedHandler, UniqueHandler])
def test_limits_and_unique_jobs_pass_the_checks_on_every_database(handler):
    """MariaDB has them too (a named lock; generated key columns under a unique index)."""
    assert ids(validate_handler(handler)) == []


@pytest.mark.parametrize(
    ("feature", "handler", "refused"),
    [("limits", LimitedHandler, "dbworker.E031"), ("unique", UniqueHandler, "dbworker.E033")],
)
def test_a_handler_using_what_the_dialect_lacks_is_refused(monkeypatch, feature, handler, refused):
    dialect = type(dialect_for(connection))
    monkeypatch.setattr(dialect, "missing", {**dialect.missing, feature: f"no {feature} here"})
    [message] = [m for m in validate_handler(handler) if m.id == refused]
    assert f"no {feature} here" in message.msg
    assert message.msg.count("\n") == 0


def test_consumers_are_refused_where_the_dialect_lacks_them(monkeypatch, settings):
    """E032 stays for a database without ordered consumers: a dialect that says so."""
    dialect = type(dialect_for(connection))
    monkeypatch.setattr(dialect, "missing", {**dialect.missing, "consumers": "no consumers"})
    settings.DBWORKER = {**settings.DBWORKER, "CONSUMERS": ["tests.testapp.consumers.Trivial"]}
    [refused] = [m for m in check_consumers() if m.id == "dbworker.E032"]
    assert "no consumers" in refused.msg


@pytest.mark.django_db
def test_unique_jobs_are_refused_where_the_dialect_lacks_them(monkeypatch):
    """E033 stays for a database without unique jobs: a dialect that says so."""
    dialect = type(dialect_for(connection))
    monkeypatch.setattr(dialect, "missing", {**dialect.missing, "unique": "no unique jobs"})
    with pytest.raises(NotSupportedHere, match=r"no unique jobs \(dbworker\.E033\)"):
        QueueJob.objects.enqueue_unique()
    assert not QueueJob.objects.exists()


@pytest.mark.django_db
def test_this_server_is_one_the_jobs_run_on():
    """MariaDB >= 10.6 passes E030 (MySQL and older MariaDB would not)."""
    assert check_servers(databases=["default"]) == []


def test_the_missing_features_are_those_the_checks_name():
    assert [f for f in ("limits", "consumers", "unique") if missing(connection, f)] == []


@pytest.mark.django_db
def test_the_workers_mariadb_sessions_are_read_committed_utc_and_standard():
    """Whatever the server's defaults (InnoDB: REPEATABLE READ), the worker's own
    connections run READ COMMITTED (no gap locks: a claim never blocks an enqueue), in
    UTC (``now`` and Django's ``Now()`` agree with what Django stores), with standard
    UPDATE assignments (the statements read columns they also set)."""
    if not MARIADB:
        pytest.skip("MariaDB's session settings")
    from django_dbworker.sql.connection import Connection

    conn = Connection("default", "test")
    try:
        [(isolation, mode, zone, timeout)] = conn.execute(
            "SELECT @@SESSION.tx_isolation, @@SESSION.sql_mode, @@SESSION.time_zone, "
            "@@SESSION.max_statement_time"
        )
    finally:
        conn.close()
    assert isolation == "READ-COMMITTED"
    assert "SIMULTANEOUS_ASSIGNMENT" in mode.split(",")
    assert zone == "+00:00"
    assert float(timeout) == 10.0


def test_a_deadlock_is_told_apart_from_other_operational_errors():
    """``enqueue_unique`` inserts again after an InnoDB deadlock (inserters of one key
    waiting on a row that changes), when the transaction was its own."""
    from django.db import OperationalError

    dialect = dialect_for(connection)
    deadlock = OperationalError(1213, "Deadlock found when trying to get lock")
    assert dialect.deadlocked(deadlock) is MARIADB
    assert not dialect.deadlocked(OperationalError(1205, "Lock wait timeout exceeded"))
    assert not dialect.deadlocked(OperationalError("database is locked"))
