import contextlib
import datetime
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.db import connection
from django.utils import timezone

from django_dbworker.maintenance import maintenance_factory
from django_dbworker.runtime.worker import Worker
from tests.pace import (  # noqa: F401 - deadlines scaled to the machine
    pytest_collection_modifyitems,
    pytest_report_header,
    scaled,
)
from tests.timeouts import pytest_runtest_makereport  # noqa: F401 - a timeout's connections

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _dbworker_log_level():
    """``call_command("runworker", verbosity=0)`` sets the ``django_dbworker`` logger's
    level for the rest of the process (as it should in a worker): put it back after each
    test, or a later test's ``caplog`` misses that logger's INFO records."""
    logger = logging.getLogger("django_dbworker")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


def wait_until(predicate, timeout=20.0, interval=0.02, message="condition"):
    """Poll ``predicate`` until it is truthy; fail (never hang) after ``timeout`` seconds
    of a quiet machine (``tests.pace``: scaled to this one's load). ``message`` may be
    a callable, called for the failure's text."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = message() if callable(message) else message
            pytest.fail(f"timed out after {timeout}s waiting for {said}")
        time.sleep(interval)


def database_now():
    """The clock a claim's ``started_at`` comes from: PostgreSQL's (the start of a new
    transaction), or this machine's (SQLite's ``now`` is the same clock)."""
    if connection.vendor == "mysql":  # UTC_TIMESTAMP(6): naive, in UTC
        with connection.cursor() as cursor:
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            return cursor.fetchone()[0].replace(tzinfo=datetime.UTC)
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def assert_no_claim_began_after(paused_at, model, in_flight):
    """No claim that began after a pause committed (``paused_at``, ``database_now()``)
    took a job. A claim of one statement writes its own start as ``started_at``: none is
    later. MariaDB's claim picks and locks its rows (the pause checked there), then
    writes them in an UPDATE of its own whose time is ``started_at``: a claim that
    began before the pause may write after it (CI: +8 ms), at most ``in_flight`` jobs
    (one claim per worker: slots and prefetch), moments after."""
    started = list(model.objects.exclude(started_at=None).values_list("started_at", flat=True))
    late = [s for s in started if s > paused_at]
    if connection.vendor != "mysql":
        assert late == [], (paused_at, late)
        return
    assert len(late) <= in_flight, (paused_at, late)
    assert all((s - paused_at).total_seconds() < 1.0 for s in late), (paused_at, late)


def server_url():
    """A DATABASE_URL for the test database on PostgreSQL itself: past the pooler when
    the suite runs through one (``python -m tests.pooler run`` sets
    ``DBWORKER_TEST_SERVER_URL``), else the suite's own."""
    url = test_database_url()
    server = os.environ.get("DBWORKER_TEST_SERVER_URL")
    if not server:
        return url
    from tests.pooler import with_port

    parts = urlsplit(server)
    return with_port(url, parts.port or 5432, host=parts.hostname or "127.0.0.1")


def server_connection(**options):
    """A psycopg connection (autocommit) to the test database on PostgreSQL itself."""
    import psycopg

    return psycopg.connect(server_url(), autocommit=True, connect_timeout=10, **options)


def test_database_url():
    """A DATABASE_URL for the database this test session runs against."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    user = settings["USER"] or ""
    password = f":{settings['PASSWORD']}" if settings["PASSWORD"] else ""
    auth = f"{user}{password}@" if user else ""
    if connection.vendor == "mysql":
        host = f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 3306}"
        return f"mysql://{auth}{host}/{settings['NAME']}"
    host = f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
    return f"postgres://{auth}{host}/{settings['NAME']}"


class ThreadedWorker:
    """A Worker run in a background thread of the test process."""

    def __init__(self, handlers, with_resetter=True, **options):
        options.setdefault("install_signal_handlers", False)
        options.setdefault("shutdown_timeout", 5.0)
        if with_resetter:
            options["maintenance"] = maintenance_factory(handlers)
        self.worker = Worker(handlers, **options)
        self.exit_code = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self):
        self.exit_code = self.worker.run()

    def start(self):
        self.thread.start()
        return self

    def stop(self, force=False, timeout=30.0):
        self.worker.stop(force=force)
        return self.join(timeout)

    def join(self, timeout=30.0):
        self.thread.join(scaled(timeout))
        assert not self.thread.is_alive(), "worker thread did not stop in time"
        return self.exit_code


@pytest.fixture
def run_worker():
    started = []

    def start(handlers, **options):
        handlers = handlers if isinstance(handlers, list | tuple) else [handlers]
        tw = ThreadedWorker(list(handlers), **options).start()
        started.append(tw)
        return tw

    yield start
    for tw in started:
        if tw.thread.is_alive():
            tw.worker.stop(force=True)
            tw.thread.join(30)
    # Handler threads a stopped worker abandoned (a handler that ignores cancellation)
    # run on in this process: let them end before the database is emptied, or what they
    # write lands in the next test's tables.
    for tw in started:
        for lane in tw.worker.lanes:
            lane.executor.join(15)
    stuck = [t for t in threading.enumerate() if t.name.startswith(("dbworker-", "test-worker"))]
    if stuck:
        # Never let them hang the run: on PostgreSQL, the flush after this test would
        # wait for their transactions' locks. Cut their connections, then say where
        # they were.
        release_connections_of_other_threads()
        frames = sys._current_frames()
        stacks = "\n".join(
            f"--- {t.name}\n" + "".join(traceback.format_stack(frames[t.ident]))
            for t in stuck
            if t.ident in frames
        )
        pytest.fail(f"worker threads still running after the test:\n{stacks}")


def release_connections_of_other_threads():
    """End every other session on the test database (PostgreSQL)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


class WorkerProcess:
    """A real ``manage.py runworker`` (or runresetter) subprocess."""

    def __init__(self, command, *args, env=None):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="dbw-", suffix=".log")  # noqa: SIM115
        self.log_path = Path(self.log.name)
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": test_database_url(),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", command, *args],
            cwd=ROOT,
            env=full_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            # As from a terminal, whether or not the test run itself ignores SIGHUP
            # (under nohup the supervisor would rightly keep ignoring it).
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
            stdin=subprocess.DEVNULL,  # not a terminal's: no Ctrl-C supervisor
        )

    @property
    def output(self):
        self.log.flush()
        return self.log_path.read_text()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout=60.0):
        timeout = scaled(timeout)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.proc.args} did not exit in {timeout}s; output:\n{self.output}")

    def kill(self):
        """SIGKILL the process and everything it started: a supervisor's worker processes
        live in sessions of their own, and left running they would take the next tests'
        jobs."""
        if self.proc.poll() is not None:
            return
        below = descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGKILL)
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


def descendants(pid):
    """The pids of every process below ``pid`` (from /proc; none where there is none)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.fixture
def spawn():
    procs = []

    def start(command, *args, env=None):
        proc = WorkerProcess(command, *args, env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.proc.poll() is None:
            proc.proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.log.close()


@pytest.fixture(scope="session")
def second_cluster():
    """A second PostgreSQL server of the suite's own (tests/clusters.py), with an empty
    database for the alias ``second``; removed at the end of the session. Skipped unless
    the suite runs on PostgreSQL and its binaries are there."""
    from tests.clusters import SecondCluster, binaries, clean_stale

    if connection.vendor != "postgresql":
        pytest.skip("two PostgreSQL servers: needs PostgreSQL (set DATABASE_URL)")
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("two PostgreSQL servers: initdb and pg_ctl not found (DBWORKER_TEST_PG_BIN)")
    clean_stale()
    cluster = SecondCluster(bin_dir)
    try:
        cluster.init()
        cluster.start()
        cluster.wait_ready()
        cluster.create_database(SECOND_NAME)
        cluster.migrated = False
        yield cluster
    finally:
        cluster.remove()


#: The database of the alias ``second`` on the second server.
SECOND_NAME = "dbworker_second"


@pytest.fixture(scope="module")
def second_database(second_cluster, django_db_setup, django_db_blocker):
    """The alias ``second`` on the second server, and tests/routers.py's router, in this
    process for the module's tests (declare ``databases=["default", "second"]``), its
    tables migrated as a user would: ``migrate --database second``. Yields the URL that
    worker subprocesses get as ``DBWORKER_TEST_SECOND_URL``."""
    import environ
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections
    from django.test.utils import override_settings

    url = second_cluster.url(SECOND_NAME)
    for databases in {id(d): d for d in (settings.DATABASES, connections.settings)}.values():
        databases["second"] = environ.Env.db_url_config(url)
        connections.configure_settings(databases)  # fills in the alias's defaults
    routed = override_settings(DATABASE_ROUTERS=["tests.routers.SecondRouter"])
    routed.enable()
    try:
        if not second_cluster.migrated:
            with django_db_blocker.unblock():
                call_command("migrate", database="second", verbosity=0, interactive=False)
            second_cluster.migrated = True
        yield url
    finally:
        routed.disable()
        with django_db_blocker.unblock():
            connections["second"].close()
        with contextlib.suppress(AttributeError):
            del connections["second"]
        settings.DATABASES.pop("second", None)
        connections.settings.pop("second", None)


def pytest_sessionfinish(session, exitstatus):
    from tests.projects import drop_databases

    drop_databases()
