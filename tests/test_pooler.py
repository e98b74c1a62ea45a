"""Behind a connection pooler (PgBouncer of our own, tests/pooler.py) and the connection
budget: no session state left on pooled server connections, timeouts that hold per
transaction, prepared statements as the database's OPTIONS say, the pooler's errors
named, wake-ups through a direct connection or a fallback that says so, and the
connections a worker really holds.

PostgreSQL only; the pooler tests are skipped where ``pgbouncer`` is not installed.
"""

from __future__ import annotations

import contextlib
import copy
import signal
import time
from io import StringIO
from urllib.parse import urlsplit

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connection, connections

from django_dbworker.models import WorkerProcess
from django_dbworker.runtime.budget import worker_need
from django_dbworker.sql import pooler
from django_dbworker.sql.connection import Connection
from tests.conftest import server_connection, server_url, wait_until
from tests.conftest import test_database_url as database_url
from tests.pooler import PgBouncer, available
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

ON_POSTGRES = connection.vendor == "postgresql"
postgres_only = pytest.mark.skipif(not ON_POSTGRES, reason="needs PostgreSQL")


def needs_pgbouncer(test):
    """PostgreSQL and a pgbouncer to start."""
    test = pytest.mark.skipif(bool(available()), reason=available() or "")(test)
    return pytest.mark.postgres(postgres_only(test))


H = "tests.testapp.handlers"
SETTINGS_SQL = (
    "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
    "current_setting('application_name')"
)


@pytest.fixture
def pgbouncer():
    """Start PgBouncers in front of the test database's server (past any pooler the suite
    itself runs through); all stopped after the test."""
    started = []
    server = urlsplit(server_url())
    user = connection.settings_dict["USER"] or "postgres"

    def start(mode, **options):
        bouncer = PgBouncer(
            mode, server=f"{server.hostname}:{server.port or 5432}", users=(user,), **options
        )
        started.append(bouncer.start())
        return bouncer

    yield start
    for bouncer in started:
        bouncer.stop()


@pytest.fixture
def unblocked(django_db_setup, django_db_blocker):
    """The test database without a test case around the test: the aliases it adds
    (``database_alias``) may then connect, from any thread."""
    with django_db_blocker.unblock():
        yield


@contextlib.contextmanager
def database_alias(name, port, **options):
    """A DATABASES alias for the test database on 127.0.0.1:``port`` (a pooler, or the
    server), with ``options`` in its OPTIONS."""
    settings_dict = copy.deepcopy(connection.settings_dict)
    settings_dict.update(HOST="127.0.0.1", PORT=str(port))
    settings_dict["OPTIONS"] = {**(settings_dict.get("OPTIONS") or {}), **options}
    connections.settings[name] = settings_dict
    try:
        yield name
    finally:
        if hasattr(connections._connections, name):
            connections[name].close()
            delattr(connections._connections, name)
        del connections.settings[name]


def server_port():
    return urlsplit(server_url()).port or 5432


def server_defaults():
    """statement_timeout, lock_timeout and application_name of a new session on the
    server (a client that sets none)."""
    with server_connection() as conn:
        return conn.execute(SETTINGS_SQL).fetchone()


# -- session state ------------------------------------------------------------------------


@needs_pgbouncer
@pytest.mark.django_db(transaction=True)
def test_a_client_sharing_a_transaction_pooler_with_busy_workers_sees_the_server_defaults(
    spawn, pgbouncer
):
    """The workers once set their timeouts and name with set_config(…, false) on whatever
    server session they landed on: every other client of the pooler then ran with a
    10 s statement timeout. Two server connections for everyone: the client lands on
    the sessions the workers use, between their transactions."""
    defaults = server_defaults()
    QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": 0.005}) for _ in range(300)
    )
    bouncer = pgbouncer("transaction", pool_size=2)
    env = {"DATABASE_URL": bouncer.url(database_url())}
    workers = [spawn("runworker", f"{H}.BehaviorHandler", env=env) for _ in range(2)]
    import psycopg

    seen, samples = set(), 0
    # prepare_threshold=None: psycopg's default (5) breaks through this pooler too.
    url = bouncer.url(database_url())
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as client:
        deadline = time.monotonic() + 90
        while QueueJob.objects.filter(state="completed").count() < 300:
            assert time.monotonic() < deadline, "\n".join(w.output for w in workers)
            for worker in workers:
                assert worker.proc.poll() is None, worker.output
            pid, *settings, listening = client.execute(
                f"SELECT pg_backend_pid(), {SETTINGS_SQL[7:]}, "
                "array(SELECT pg_listening_channels())"
            ).fetchone()
            assert tuple(settings) == defaults, f"session state of a worker: {settings}"
            assert listening == [], "a LISTEN left on a pooled server session"
            seen.add(pid)
            samples += 1
            time.sleep(0.005)
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output
        assert "prepared statement" not in worker.output
    assert samples >= 20
    assert len(seen) <= 2  # the server sessions the workers ran in


@needs_pgbouncer
def test_timeouts_hold_in_whichever_server_session_a_statement_lands(
    unblocked, pgbouncer, settings
):
    """Set once per session, the timeouts held only on the server connection the worker
    was configured on: a statement the pooler sent elsewhere ran without them."""
    settings.DBWORKER = {"STATEMENT_TIMEOUT": 0.3}
    bouncer = pgbouncer("transaction", pool_size=2)
    import psycopg

    with database_alias("pooled", bouncer.port) as alias:
        conn = Connection(alias, "test")
        other = psycopg.connect(
            bouncer.url(database_url()), autocommit=True, prepare_threshold=None
        )
        try:
            conn.execute("SELECT 1")
            assert conn.pooled
            # Another client holds the session conn just used: conn lands on the other.
            other.execute("BEGIN")
            held = other.execute("SELECT pg_backend_pid()").fetchone()[0]
            landed = conn.execute("SELECT pg_backend_pid()")[0][0]
            assert landed != held
            started = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(3)")
            assert time.monotonic() - started < 2
            other.execute("COMMIT")
            # A lock wait too (the limited claim's advisory lock), in its transaction.
            with server_connection() as holder:
                holder.execute("SELECT pg_advisory_lock(7, 7)")
                started = time.monotonic()
                with pytest.raises((psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)):
                    conn.execute_locked((7, 7), "SELECT 1", {}, lambda rows: [])
                assert time.monotonic() - started < 2
            # And nothing stays: the session's own values are the server's.
            assert other.execute(SETTINGS_SQL).fetchone() == server_defaults()
        finally:
            other.close()
            conn.close()


# -- prepared statements ------------------------------------------------------------------


@needs_pgbouncer
@pytest.mark.parametrize(
    ("setting", "options", "direct", "pooled"),
    [
        pytest.param(None, {}, 0, None, id="defaults"),
        pytest.param(None, {"prepare_threshold": 5}, 5, 5, id="options"),
        pytest.param(None, {"prepare_threshold": None}, None, None, id="options-none"),
        pytest.param(True, {}, 0, 0, id="setting-true"),
        pytest.param(False, {"prepare_threshold": 5}, None, None, id="setting-false"),
    ],
)
def test_statements_are_prepared_as_the_database_options_say(
    unblocked, pgbouncer, settings, setting, options, direct, pooled
):
    """The worker forced prepare_threshold (0, or None) whatever the database's OPTIONS
    said; now it follows them, and Django's default (None) through a pooler, while a
    direct connection keeps preparing."""
    settings.DBWORKER = {"PREPARED_STATEMENTS": setting}
    bouncer = pgbouncer("transaction")
    for port, expected in ((server_port(), direct), (bouncer.port, pooled)):
        with database_alias("probed", port, **options) as alias:
            conn = Connection(alias, "test")
            try:
                for _ in range(2):
                    conn.execute("SELECT %(x)s::int", {"x": 1})
                assert conn.wrapper.connection.prepare_threshold == expected
                if port == server_port():
                    assert not conn.pooled
                    prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements")
                    assert (prepared[0][0] > 0) == (expected == 0)
            finally:
                conn.close()


@needs_pgbouncer
def test_a_poolers_prepared_statement_errors_name_the_setting(
    unblocked, pgbouncer, settings, caplog
):
    """Through PgBouncer < 1.21 in transaction mode, two clients' prepared statements
    share one server session: 'prepared statement "_pg3_0" already exists'."""
    settings.DBWORKER = {"PREPARED_STATEMENTS": True}
    bouncer = pgbouncer("transaction", pool_size=1)
    import psycopg

    with database_alias("pooled", bouncer.port) as alias:
        first, second = Connection(alias, "first"), Connection(alias, "second")
        try:
            first.execute("SELECT %(x)s::int", {"x": 1})
            with caplog.at_level("ERROR", "django_dbworker.db"):
                with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
                    second.execute("SELECT %(y)s::text", {"y": "a"})
                # Again: said once. (It may pass: PgBouncer may have given the client
                # another server connection meanwhile, as it did on a loaded CI host.)
                with contextlib.suppress(psycopg.errors.DuplicatePreparedStatement):
                    second.execute("SELECT %(y)s::text", {"y": "a"})
        finally:
            first.close()
            second.close()
    [record] = [r for r in caplog.records if r.name == "django_dbworker.db"]  # once
    assert "set DBWORKER['PREPARED_STATEMENTS'] = False (it is True)" in record.getMessage()
    assert "already exists" in record.getMessage()


@postgres_only
def test_the_poolers_errors_are_recognised():
    import psycopg

    assert pooler.is_pooler_error(psycopg.errors.DuplicatePreparedStatement("x"))
    assert pooler.is_pooler_error(psycopg.errors.InvalidSqlStatementName("x"))
    assert pooler.is_pooler_error(
        psycopg.errors.ProtocolViolation(
            'bind message supplies 2 parameters, but prepared statement "_pg3_3" requires 7'
        )
    )
    assert not pooler.is_pooler_error(psycopg.errors.ProtocolViolation("something else"))
    assert not pooler.is_pooler_error(psycopg.errors.QueryCanceled("x"))


# -- wake-ups -----------------------------------------------------------------------------

LISTENING = "wake-ups: listening"
UNAVAILABLE = "wake-ups do not work"


@needs_pgbouncer
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("mode", "listen", "woken"),
    [
        pytest.param("transaction", None, False, id="transaction"),
        pytest.param("transaction", "direct", True, id="transaction-listen-direct"),
        pytest.param("session", None, False, id="session"),
        pytest.param("session", "pooled", True, id="session-listen-pooled"),
    ],
)
def test_wakeups_behind_a_pooler(spawn, pgbouncer, mode, listen, woken):
    """In transaction mode the LISTEN was lost without a word and pickup fell to
    polling. Now: behind a pooler the listener LISTENs only where
    DBWORKER['LISTEN_DATABASE'] says it may (a direct connection, or the pooled alias
    of a pooler in session mode); without it, it says once how to get wake-ups."""
    bouncer = pgbouncer(mode)
    env = {"DATABASE_URL": bouncer.url(database_url())}
    if listen == "direct":
        env["DBWORKER_TEST_LISTEN_URL"] = server_url()
    elif listen == "pooled":
        env["DBWORKER_TEST_LISTEN_POOLED"] = "1"
    worker = spawn("runworker", f"{H}.SlowPollHandler", env=env)  # polls every 30 s
    expected = LISTENING if woken else UNAVAILABLE
    wait_until(lambda: expected in worker.output, 20, message=f"{expected}: {worker.output}")
    # Enqueue after the worker's first claim (which follows its registry row within
    # moments): under load the listener's probe spoke first, the first claim came after
    # the enqueue and took the job, with no wake-up (seen in CI).
    wait_until(WorkerProcess.objects.exists, 20, message="the worker's registry row")
    time.sleep(1.0)
    QueueJob.objects.create()
    if woken:
        wait_until(
            lambda: QueueJob.objects.filter(state="completed").exists(), 10, message="wake-up"
        )
    else:
        time.sleep(2)
        assert not QueueJob.objects.filter(state="completed").exists()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
    assert worker.output.count(UNAVAILABLE) == (0 if woken else 1), worker.output


@needs_pgbouncer
@pytest.mark.django_db(transaction=True)
def test_without_wakeups_an_idle_worker_polls_at_its_interval(spawn, pgbouncer):
    """Once the probe finds that wake-ups do not arrive, idle lanes stop backing off to
    max_interval (30 s here) and poll at interval (0.5 s)."""
    bouncer = pgbouncer("transaction")
    env = {"DATABASE_URL": bouncer.url(database_url())}
    worker = spawn("runworker", f"{H}.BackoffHandler", env=env)
    wait_until(lambda: UNAVAILABLE in worker.output, 20, message="the probe's verdict")
    for n in range(1, 4):
        time.sleep(2.5)  # backing off, the worker would have slept 4 s and more by now
        QueueJob.objects.create()
        wait_until(
            lambda n=n: QueueJob.objects.filter(state="completed").count() == n,
            3,
            message=f"job {n} picked up by polling",
        )
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output


# -- the connection budget ----------------------------------------------------------------


def sessions():
    """(application_name, last query) of the sessions ``backends`` counts."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name, left(query, 50) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend' "
            "AND pid <> pg_backend_pid()"
        )
        return cursor.fetchall()


def backends():
    """Client sessions on the test database other than the test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@pytest.mark.postgres
@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_worker_holds_the_connections_the_docs_count(spawn):
    """docs/operations.md: 3 of its own (dispatcher and resetter, heartbeat and registry,
    writer and statistics), 1 LISTEN, and one per handler thread that uses the ORM. The
    worker once held 6 of its own (a resetter's and a statistics' connection too), and
    runresetter an idle Django connection besides its own."""
    # The sessions of an earlier test's processes may still be closing.
    wait_until(lambda: backends() == 0, 15, message=lambda: f"no other session: {sessions()}")
    # One job ends first (the writer's connection opens), three then keep all threads.
    QueueJob.objects.create(behavior="ok")
    QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": 30}) for _ in range(3)
    )
    worker = spawn(
        "runworker",
        f"{H}.BehaviorHandler",
        "--num-handlers",
        "3",
        env={"DATABASE_URL": database_url() + "?conn_max_age=60"},
    )
    wait_until(
        lambda: (
            QueueJob.objects.filter(state="processing").count() == 3
            and QueueJob.objects.filter(state="completed").count() == 1
        ),
        20,
        message="one job done, three running",
    )
    expected = 3 + 1 + 3  # its own, the listener, three handler threads (ORM)
    wait_until(lambda: backends() == expected, 10, message=f"{expected} connections")
    time.sleep(1.0)  # a statistics flush, a resetter pass, a few heartbeats later
    assert backends() == expected, sessions()
    wait_until(
        lambda: WorkerProcess.objects.filter(num_connections=expected).exists(),
        5,
        message="the registry's count",
    )
    out = StringIO()
    call_command("dbworker_status", stdout=out)
    assert f"connections: {expected}" in out.getvalue()
    need = worker_need([h.BehaviorHandler(num_handlers=3)])
    assert need.total == expected + 1  # the dispatcher's hooks may use the ORM too
    worker.kill()

    wait_until(lambda: backends() == 0, 10, message="the killed worker's sessions to end")
    resetter = spawn("runresetter", f"{H}.BehaviorHandler", "--interval", "0.2")
    wait_until(lambda: "resetter started" in resetter.output, 20, message="the resetter")
    time.sleep(1.0)
    assert backends() == 1
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0, resetter.output


def test_connection_budget_check(settings):
    settings.DBWORKER = {
        "HANDLERS": [f"{H}.BehaviorHandler", f"{H}.LimitedHandler"],
        "CONNECTION_BUDGET": 10,
    }
    [message] = checks.run_checks(tags=["dbworker"])
    # 3 own + 1 LISTEN (PostgreSQL) + 4 + 4 handler threads + 1 for the dispatcher's hooks.
    need = 13 if ON_POSTGRES else 12
    assert message.id == "dbworker.W007"
    assert f"may hold {need} database connections" in message.msg
    settings.DBWORKER = {**settings.DBWORKER, "CONNECTION_BUDGET": need}
    assert checks.run_checks(tags=["dbworker"]) == []


@postgres_only
def test_a_pool_caps_the_orm_connections_in_the_budget(settings):
    settings.DBWORKER = {"HANDLERS": [f"{H}.BehaviorHandler"], "CONNECTION_BUDGET": 7}
    default = connections["default"].settings_dict
    options = default.get("OPTIONS") or {}
    try:
        default["OPTIONS"] = {**options, "pool": {"min_size": 1, "max_size": 2}}
        assert checks.run_checks(tags=["dbworker"]) == []  # 3 + 1 + 2
        need = worker_need([h.BehaviorHandler])
        assert (need.orm, need.pooled) == (2, ["default"])
        settings.DBWORKER = {**settings.DBWORKER, "NOTIFY": False, "CONNECTION_BUDGET": 4}
        [message] = checks.run_checks(tags=["dbworker"])
        assert "may hold 5 database connections (3 of its own, 2 for handlers" in message.msg
    finally:
        default["OPTIONS"] = options


@pytest.mark.parametrize(
    "setting",
    [
        {"PREPARED_STATEMENTS": "yes"},
        {"LISTEN_DATABASE": "nope"},
        {"LISTEN_DATABASE": {"default": "nope"}},
        {"LISTEN_DATABASE": {"nope": "default"}},
        {"LISTEN_DATABASE": 3},
        {"CONNECTION_BUDGET": 0},
        {"CONNECTION_BUDGET": True},
        {"CONNECTION_BUDGET": 2.5},
    ],
)
def test_pooler_settings_are_checked(settings, setting):
    settings.DBWORKER = setting
    assert {m.id for m in checks.run_checks(tags=["dbworker"])} == {"dbworker.E001"}


def test_pooler_settings_that_are_fine(settings):
    fine = [{"PREPARED_STATEMENTS": None}, {"PREPARED_STATEMENTS": False}]
    fine += [{"CONNECTION_BUDGET": 100}]
    if ON_POSTGRES:  # LISTEN is PostgreSQL's
        fine += [{"LISTEN_DATABASE": "default"}, {"LISTEN_DATABASE": {"default": "default"}}]
    for setting in fine:
        settings.DBWORKER = setting
        assert checks.run_checks(tags=["dbworker"]) == [], setting


def test_the_listen_alias(settings):
    from django_dbworker.sql.notify import listen_alias

    assert listen_alias("default") == "default"
    settings.DBWORKER = {"LISTEN_DATABASE": "direct"}
    assert listen_alias("default") == "direct"
    settings.DBWORKER = {"LISTEN_DATABASE": {"other": "direct"}}
    assert listen_alias("default") == "default"
    assert listen_alias("other") == "direct"
