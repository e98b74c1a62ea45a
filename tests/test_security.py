"""Values never reach SQL by interpolation; secrets never reach the logs."""

import signal
import subprocess
import sys
import time

import pytest
from django.core.exceptions import FieldDoesNotExist
from django.db import connection
from django.db.models import Q

from django_dbworker.checks import validate_handler
from django_dbworker.sql.connection import Connection
from django_dbworker.sql.jobs import statements_for
from tests.conftest import ROOT, wait_until
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

#: Quotes, comment markers, placeholders and a statement: whatever a value holds.
EVIL = "evil'); DROP TABLE testapp_queuejob; -- \" %s %% ?"


class HostileHandler(h.BehaviorHandler):
    name = f"handler {EVIL}"
    dequeue_filter = Q(behavior__in=["hostile", EVIL]) | Q(payload__k=EVIL)

    def pre_dequeue(self):
        return ~Q(behavior=EVIL) & Q(repository__name__isnull=True) | Q(repository__name=EVIL)

    def handle(self, job):
        with self.attempt.log(EVIL, [EVIL, "--flag"]) as entry:
            entry.update(out=EVIL)
        raise RuntimeError(EVIL)


@pytest.mark.django_db(transaction=True)
def test_no_value_reaches_the_sql_text(run_worker, monkeypatch):
    sent = []
    execute = Connection.execute

    def spy(self, sql, params=()):
        sent.append((sql, list(params.values() if isinstance(params, dict) else params)))
        return execute(self, sql, params)

    monkeypatch.setattr(Connection, "execute", spy)
    job = JobFactory(behavior="hostile", payload={"k": EVIL})
    tw = run_worker(HostileHandler(max_num_retries=0), worker_id=f"host:1:{EVIL}", burst=True)
    assert tw.join(30) == 0

    assert sent
    assert not [sql for sql, _ in sent if "evil" in sql.lower()]
    assert any(EVIL in value for _, params in sent for value in params if isinstance(value, str))
    job.refresh_from_db()  # stored verbatim, and the table is still there
    assert job.state == "failed"
    assert job.worker_hostname == f"host:1:{EVIL}"
    assert job.failure_message.startswith(f"RuntimeError: {EVIL}")
    [entry] = job.execution_logs
    assert (entry["key"], entry["command"], entry["out"]) == (EVIL, [EVIL, "--flag"], EVIL)


@pytest.mark.parametrize("name", ["id; DROP TABLE testapp_queuejob", "-id DESC", "--id", "pk)"])
def test_ordering_names_must_be_model_fields(name):
    sql = statements_for(QueueJob, connection.vendor, "default")
    with pytest.raises(FieldDoesNotExist):
        sql.order_by((name,))
    messages = validate_handler(h.BehaviorHandler(ordering=(name,)))
    assert [m.id for m in messages] == ["dbworker.E005"]


@pytest.mark.postgres
@pytest.mark.subprocess
@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_database_password_never_appears_in_worker_logs():
    """The URL carries a password (trust auth ignores it). Workers and a resetter log at
    debug level through failing jobs, connections cut under them, and a server they
    cannot reach: the password shows nowhere."""
    secret = "Sekr1t-pa55word-4f9c"
    settings = connection.settings_dict
    user = settings["USER"] or "postgres"
    host = f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
    url = f"postgres://{user}:{secret}@{host}/{settings['NAME']}"
    unreachable = f"postgres://{user}:{secret}@127.0.0.1:1/{settings['NAME']}"
    JobFactory.create_batch(10, behavior="fail")
    JobFactory.create_batch(10, behavior="log")
    handler = "tests.testapp.handlers.BehaviorHandler"
    procs = [start([cmd, handler], url) for cmd in ("runworker", "runresetter")]
    wait_until(lambda: QueueJob.objects.exclude(state="queued").exists(), timeout=30)
    with connection.cursor() as cursor:  # cut the workers' connections mid-run
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    procs += [
        start(["runworker", handler, "--max-time", "3"], unreachable),
        start(["runresetter", handler, "--once"], unreachable),
    ]
    time.sleep(4)
    outputs = [stop(proc) for proc in procs]
    assert all(outputs)
    assert "unreachable" in outputs[2]  # it did log the failures
    for output in outputs:
        assert secret not in output


def start(args, url):
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args, "-v", "2"],
        cwd=ROOT,
        env={
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": url,
            "PYTHONUNBUFFERED": "1",
            "PATH": "/usr/bin:/bin",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,  # not a terminal's: no Ctrl-C supervisor
    )


def stop(proc):
    """SIGTERM (if still running) and the whole output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate(timeout=10)
    return output
