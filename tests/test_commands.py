"""runworker / runresetter input handling and the system checks."""

import contextlib
import io
import logging
import os
import re
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db import models as django_models
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import Q
from django.utils import timezone

from django_dbworker.checks import validate_handler
from django_dbworker.management.commands._options import check_tables
from django_dbworker.models import (
    WorkerJob,
    WorkerProcess,
    dequeue_index,
    processing_index,
    state_constraint,
    state_index,
    waiting_index,
)
from tests.conftest import ROOT, wait_until
from tests.conftest import test_database_url as database_url
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob, RepositoryIndexingJob

H = "tests.testapp.handlers"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no.such.Module"], "cannot import handler 'no.such.Module': no module named 'no'"),
        (
            [f"{H}.NoSuchHandler"],
            f"cannot import handler '{H}.NoSuchHandler': module '{H}' has no attribute",
        ),
        (["NoDots"], "not a dotted path (package.module.ClassName)"),
        (
            [f"{H}.BehaviourHandler"],
            "has no attribute 'BehaviourHandler'; did you mean 'BehaviorHandler'?",
        ),
        ([f"{H}.record"], "is not a Handler subclass"),
        ([f"{H}.NoModelHandler"], "has no model. (dbworker.E003)"),
        ([f"{H}.NotAJobModelHandler"], "is not a subclass of django_dbworker.models.WorkerJob"),
        ([f"{H}.BadOptionsHandler"], "num_handlers must be an integer >= 1, not 0"),
        ([f"{H}.BadOrderingHandler"], "ordering item 'no_such_field' is not a concrete field"),
        ([f"{H}.BadStaticFilterHandler"], "dequeue_filter cannot be used: FieldError"),
        ([f"{H}.NoHandleHandler"], "defines no handle(job) method"),
        ([f"{H}.MisspeltHandleHandler"], "(dbworker.E007) Rename 'handel' to 'handle'."),
        ([f"{H}.BehaviorHandler", "--num-handlers", "0"], "--num-handlers must be > 0"),
        ([f"{H}.BehaviorHandler", "--num-handlers", "many"], "--num-handlers must be a whole"),
        (
            [f"{H}.BehaviorHandler", "--num-handlers", "2.5"],
            "--num-handlers must be a whole number, not '2.5'",
        ),
        ([f"{H}.BehaviorHandler", "--prefetch", "1.5"], "--prefetch must be a whole number"),
        ([f"{H}.BehaviorHandler", "--processes", "2.0"], "--processes must be a whole number"),
        ([f"{H}.BehaviorHandler", "--interval", "-1"], "--interval must be > 0"),
        (
            [f"{H}.BehaviorHandler", "--interval", "inf"],
            "--interval must be a finite number, not 'inf'",
        ),
        ([f"{H}.BehaviorHandler", "--interval", "nan"], "--interval must be a finite number"),
        ([f"{H}.BehaviorHandler", "--max-time", "Infinity"], "--max-time must be a finite number"),
        ([f"{H}.BehaviorHandler", "--max-jobs", "x"], "--max-jobs must be a whole number"),
        ([f"{H}.BehaviorHandler", "--max-jobs", "1e3"], "--max-jobs must be a whole number"),
        ([f"{H}.BehaviorHandler", "--shutdown-timeout", "-2"], "--shutdown-timeout must be >= 0"),
        (
            [f"{H}.BehaviorHandler", "--shutdown-timeout", "nan"],
            "--shutdown-timeout must be a finite number",
        ),
        ([], "no handlers: name them"),
    ],
)
def test_runworker_rejects_bad_input_in_one_line(args, message):
    with pytest.raises(CommandError) as info:
        call_command("runworker", *args)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no.such.Handler"], "cannot import handler"),
        ([f"{H}.NoModelHandler"], "has no model"),
        ([f"{H}.NoHandleHandler"], "(dbworker.E007)"),
        ([f"{H}.BehaviorHandler", "--interval", "0"], "--interval must be > 0"),
        ([f"{H}.BehaviorHandler", "--interval", "inf"], "--interval must be a finite number"),
        ([f"{H}.BehaviorHandler", "--interval", "NaN"], "--interval must be a finite number"),
        ([], "no handlers"),
    ],
)
def test_runresetter_rejects_bad_input_in_one_line(args, message):
    with pytest.raises(CommandError) as info:
        call_command("runresetter", *args)
    assert message in str(info.value)


@contextlib.contextmanager
def dropped_table(model, unrecord=None):
    """The table of ``model`` is dropped (and migration ``unrecord`` marked unapplied)
    for the block, then put back."""
    recorder = MigrationRecorder(connection)
    with connection.schema_editor() as editor:
        editor.delete_model(model)
    if unrecord:
        recorder.record_unapplied(*unrecord)
    try:
        yield
    finally:
        if unrecord:
            recorder.record_applied(*unrecord)
        with connection.schema_editor() as editor:
            editor.create_model(model)


@pytest.mark.django_db(transaction=True)
def test_a_table_whose_migration_is_not_applied_says_migrate():
    expected = (
        "table 'testapp_repositoryindexingjob' of testapp.RepositoryIndexingJob does not exist "
        "in database 'default'; run `python manage.py migrate` "
        "(not applied: testapp.0004_repositoryindexingjob)"
    )
    with dropped_table(RepositoryIndexingJob, ("testapp", "0004_repositoryindexingjob")):
        for command, args in [
            ("runworker", [f"{H}.RepositoryIndexingHandler", "--burst"]),
            ("runresetter", [f"{H}.RepositoryIndexingHandler", "--once"]),
            ("dbworker_status", []),
        ]:
            with pytest.raises(CommandError) as info:
                call_command(command, *args, stdout=io.StringIO())
            assert str(info.value) == expected


@pytest.mark.django_db(transaction=True)
def test_a_table_dropped_behind_applied_migrations_is_not_a_missing_migrate():
    with dropped_table(QueueJob), pytest.raises(CommandError) as info:
        call_command("runworker", f"{H}.BehaviorHandler", "--burst")
    assert str(info.value).endswith(
        "the migrations of app 'testapp' are all recorded as applied in 'default', so the "
        "table was dropped or renamed outside migrations"
    )


@pytest.mark.django_db
def test_a_model_no_migration_creates_says_makemigrations(temporary_models):
    """A missing table used to say "run migrate" when makemigrations was missing, and
    dbworker_status crashed with the raw OperationalError."""

    class UnmigratedJob(WorkerJob):
        class Meta(WorkerJob.Meta):
            app_label = "testapp"

    expected = (
        "table 'testapp_unmigratedjob' of testapp.UnmigratedJob does not exist in database "
        "'default'; no migration of app 'testapp' creates UnmigratedJob: run "
        "`python manage.py makemigrations testapp`, then `python manage.py migrate`"
    )
    with pytest.raises(CommandError) as info:
        check_tables([h.BehaviorHandler(model=UnmigratedJob)])
    assert str(info.value) == expected
    with pytest.raises(CommandError) as info:
        call_command("dbworker_status", stdout=io.StringIO())
    assert str(info.value) == expected


@pytest.mark.django_db
def test_dbworker_status_counts_states_and_tells_alive_from_silent_workers():
    JobFactory.create_batch(2)
    JobFactory(state="failed")
    now = timezone.now()
    for worker_id, heartbeat in [("host:1:a", now), ("host:2:b", now - timedelta(minutes=5))]:
        WorkerProcess.objects.create(
            worker_id=worker_id, hostname="host", pid=1, started_at=now, last_heartbeat_at=heartbeat
        )
    out = io.StringIO()
    call_command("dbworker_status", stdout=out)
    lines = out.getvalue().splitlines()
    [row] = [line for line in lines if line.startswith("testapp.QueueJob ")]
    assert row.split()[1:] == ["2", "0", "0", "0", "1", "0"]  # queued ... failed, canceled
    assert any("host:1:a  alive  " in line for line in lines)
    assert any("host:2:b  silent (dead?)  " in line and "(30" in line for line in lines)


NOWHERE = "postgres://postgres@127.0.0.1:1/dbw_cmds_nowhere"


def manage(*args, database_url=None, timeout=60, **popen):
    """``python -m django <args>`` with the test settings, as a user runs it."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def test_dbworker_status_on_an_unreachable_database_says_so_in_one_line():
    result = manage("dbworker_status", database_url=NOWHERE)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert re.match(r"CommandError: cannot read \w+\.\w+ from database 'default': ", line), line
    assert "port 1 failed" in line


@pytest.mark.django_db(transaction=True)
def test_runworker_burst_and_handlers_from_settings(settings):
    settings.DBWORKER = {"HANDLERS": [f"{H}.BehaviorHandler"]}
    JobFactory.create_batch(3)
    call_command("runworker", "--burst", "--num-handlers", "2", verbosity=0)
    assert set(QueueJob.objects.values_list("state", flat=True)) == {"completed"}


@pytest.mark.django_db(transaction=True)
def test_runresetter_once_says_it_runs_one_pass_and_what_it_did(caplog):
    """--once used to log "every 10s" and print nothing when nothing was reset."""
    from datetime import timedelta

    from django.utils import timezone

    job = JobFactory(state="processing", last_heartbeat_at=timezone.now() - timedelta(minutes=1))
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        call_command("runresetter", f"{H}.BehaviorHandler", "--once", stdout=out)
    job.refresh_from_db()
    assert (job.state, job.num_resets) == ("queued", 1)
    assert out.getvalue() == f"{H}.BehaviorHandler: reset 1 stalled job, failed 0\n"
    logged = [record.getMessage() for record in caplog.records]
    assert f"resetter: one pass for {H}.BehaviorHandler" in logged
    assert not [line for line in logged if "every" in line]

    out = io.StringIO()
    call_command("runresetter", f"{H}.BehaviorHandler", "--once", stdout=out)
    assert out.getvalue() == f"{H}.BehaviorHandler: reset 0 stalled jobs, failed 0\n"
    out = io.StringIO()
    call_command("runresetter", f"{H}.BehaviorHandler", "--once", stdout=out, verbosity=0)
    assert out.getvalue() == ""


def test_runresetter_once_on_an_unreachable_database_fails_in_one_line():
    result = manage(
        "runresetter",
        f"{H}.BehaviorHandler",
        "--once",
        "--startup-timeout",
        "0",
        database_url=NOWHERE,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith(
        "CommandError: database 'default' unreachable for 0s: "
    )
    assert "Traceback" not in result.stderr


def ids(messages):
    return sorted({m.id for m in messages})


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (h.BehaviorHandler, []),
        (h.NoModelHandler, ["dbworker.E003"]),
        (h.NotAJobModelHandler, ["dbworker.E003"]),
        (h.BadOptionsHandler, ["dbworker.E004"]),
        (h.BadOrderingHandler, ["dbworker.E005"]),
        (h.BehaviorHandler(retry_backoff=0.5), ["dbworker.E004"]),
        (h.BehaviorHandler(interval="soon"), ["dbworker.E004"]),
        (h.BehaviorHandler(interval=float("inf")), ["dbworker.E004"]),
        (h.BehaviorHandler(stalled_max_age=float("nan")), ["dbworker.E004"]),
        (h.BehaviorHandler(retry_backoff=float("inf")), ["dbworker.E004"]),
        (h.BehaviorHandler(dequeue_filter="state='x'"), ["dbworker.E004"]),
        (h.BehaviorHandler(dequeue_filter=Q(no_such_field=1)), ["dbworker.E004"]),
        (h.BehaviorHandler(dequeue_filter=Q(repository__name__startswith="a")), []),
        (h.BehaviorHandler(stalled_max_age=0.5, heartbeat_interval=1), ["dbworker.W001"]),
        (h.BehaviorHandler(ordering="id"), ["dbworker.E005"]),
        (h.NoHandleHandler, ["dbworker.E007"]),
        (h.MisspeltHandleHandler, ["dbworker.E007"]),
        (h.MisspeltHandleHandler(), ["dbworker.E007"]),
    ],
)
def test_validate_handler(handler, expected):
    assert ids(validate_handler(handler)) == expected


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"HANDLERS": [f"{H}.BehaviorHandler"]}, []),
        ({"HANDLERS": ["nope.Handler"]}, ["dbworker.W003"]),
        ({"HANDLERS": [f"{H}.BadOptionsHandler"]}, ["dbworker.W003"]),
        ({"HANDLERS": [f"{H}.NoModelHandler"]}, ["dbworker.W003"]),
        ({"HANDLERS": [f"{H}.NoHandleHandler"]}, ["dbworker.W003"]),
        ({"HANDLERS": "tests.Handler"}, ["dbworker.E001"]),
        ({"NO_SUCH_KEY": 1}, ["dbworker.E001"]),
        ({"RESET_INTERVAL": 0}, ["dbworker.E001"]),
        ({"RESET_INTERVAL": float("inf")}, ["dbworker.E001"]),
        ({"STATEMENT_TIMEOUT": float("nan")}, ["dbworker.E001"]),
        ({"STATEMENT_TIMEOUT": "10s"}, ["dbworker.E001"]),
        ({"NOTIFY": "yes"}, ["dbworker.E001"]),
        ([], ["dbworker.E001"]),
    ],
)
def test_settings_checks(settings, setting, expected):
    settings.DBWORKER = setting
    messages = checks.run_checks(tags=["dbworker"])
    assert ids(messages) == expected


@pytest.mark.django_db
def test_a_broken_handler_in_settings_stops_only_the_worker_commands(settings):
    """A typo in DBWORKER["HANDLERS"] used to be an error of every system check run,
    so `migrate` and `runserver` of the whole site refused to start."""
    settings.DBWORKER = {"HANDLERS": [f"{H}.NoSuchHandler"]}
    [message] = checks.run_checks(tags=["dbworker"])
    assert message.level == checks.WARNING
    assert "runworker and runresetter will refuse to start" in message.msg
    assert "(dbworker.E002)" in message.msg
    call_command("check")  # raises SystemCheckError on errors
    for command in ("runworker", "runresetter"):
        with pytest.raises(CommandError, match=r"cannot import handler .*NoSuchHandler"):
            call_command(command)


@pytest.fixture
def temporary_models():
    """Models a test defines in testapp are unregistered after it."""
    from django.apps import apps

    before = set(apps.all_models["testapp"])
    yield
    for name in set(apps.all_models["testapp"]) - before:
        del apps.all_models["testapp"][name]
    apps.clear_cache()


def job_model_messages(model):
    from django_dbworker.checks import check_job_models

    return [m for m in check_job_models() if m.obj is model]


def test_model_without_the_schema_of_workerjob_meta_is_flagged(temporary_models):
    class NoIndexJob(WorkerJob):
        class Meta:
            app_label = "testapp"

    [message] = job_model_messages(NoIndexJob)
    assert message.id == "dbworker.W002"
    assert "the dequeue index" in message.msg
    assert "the state index" in message.msg
    assert "the state check constraint" in message.msg


def test_w002_checks_the_state_index_and_the_state_constraint(temporary_models):
    """W002 used to look at the dequeue index only. The processing index is no longer
    asked for (the state index serves its scans), and a Meta that keeps it is fine."""

    class OnlyDequeueIndexJob(WorkerJob):
        class Meta:
            app_label = "testapp"
            indexes = [dequeue_index("id", name="testapp_onlydq_dq")]
            constraints = [state_constraint(name="testapp_onlydq_state")]

    class NoConstraintJob(WorkerJob):
        class Meta(WorkerJob.Meta):
            app_label = "testapp"
            constraints = []

    class RebuiltJob(WorkerJob):
        class Meta:
            app_label = "testapp"
            indexes = [
                dequeue_index("-id", name="testapp_rebuilt_dq"),
                waiting_index(name="testapp_rebuilt_wt"),
                processing_index(name="testapp_rebuilt_run"),
                state_index(name="testapp_rebuilt_st"),
            ]
            constraints = [state_constraint(name="testapp_rebuilt_state")]

    [message] = job_model_messages(OnlyDequeueIndexJob)
    assert message.id == "dbworker.W002"
    assert "lacks the waiting index" in message.msg
    assert "the state index" in message.msg
    assert "processing" not in message.msg
    assert "dequeue" not in message.msg
    assert "constraint" not in message.msg
    [message] = job_model_messages(NoConstraintJob)
    assert "lacks the state check constraint" in message.msg
    assert "index" not in message.msg.split("lacks")[1]
    assert job_model_messages(RebuiltJob) == []
    assert job_model_messages(QueueJob) == []


def test_proxy_job_models_are_not_flagged(temporary_models):
    class ProxyJob(QueueJob):
        class Meta:
            proxy = True
            app_label = "testapp"

    assert job_model_messages(ProxyJob) == []


def test_multi_table_children_of_a_job_model_are_refused(temporary_models):
    """`class Child(ConcreteJob)` keeps the bookkeeping columns in the parent's table;
    it used to pass every check."""

    class ChildJob(QueueJob):
        extra = django_models.IntegerField(default=0)

        class Meta:
            app_label = "testapp"

    [message] = job_model_messages(ChildJob)
    assert message.id == "dbworker.E008"
    assert "extends the concrete job model testapp.QueueJob" in message.msg
    handler_messages = validate_handler(h.BehaviorHandler(model=ChildJob))
    assert ids(handler_messages) == ["dbworker.E008"]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL has this lookup")
def test_a_lookup_the_database_lacks_is_refused_at_start():
    """It used to be reported as a database error at every claim, with backoff, forever."""
    messages = validate_handler(h.BehaviorHandler(dequeue_filter=Q(payload__contains={"k": 1})))
    assert ids(messages) == ["dbworker.E004"]
    assert "NotSupportedError" in messages[0].msg


def test_a_handler_without_handle_is_refused_with_a_hint():
    """It used to pass every check and fail every job with NotImplementedError."""
    [message] = validate_handler(h.MisspeltHandleHandler)
    assert message.id == "dbworker.E007"
    assert message.hint == "Rename 'handel' to 'handle'."
    [message] = validate_handler(h.NoHandleHandler)
    assert message.hint == "Define handle(self, job) on the class."


@pytest.mark.parametrize(
    ("module", "raised"),
    [
        ("broken_import", "ImportError: cannot import name 'NoSuchModel'"),
        ("missing_dependency", "ModuleNotFoundError: No module named 'dbworker_no_such_dep"),
    ],
)
def test_a_handler_module_that_raises_on_import_is_not_called_a_wrong_path(module, raised):
    """An ImportError inside the module used to read "cannot import handler …", like a
    typo in the path, and the module's own exception was dropped."""
    path = f"tests.testapp.{module}.SomeHandler"
    with pytest.raises(CommandError) as info:
        call_command("runworker", path)
    message = str(info.value)
    assert message.startswith(f"handler '{path}': importing module 'tests.testapp.{module}' raised")
    assert raised in message
    assert f"tests/testapp/{module}.py, line" in message
    assert "cannot import handler" not in message
    assert "\n" not in message
    assert isinstance(info.value.__cause__, ImportError)  # what --traceback prints


def test_traceback_shows_the_exception_the_handler_module_raised():
    result = manage("runworker", "tests.testapp.broken_import.SomeHandler", "--traceback")
    assert result.returncode == 1
    assert 'tests/testapp/broken_import.py", line' in result.stderr, result.stderr
    assert "ImportError: cannot import name 'NoSuchModel'" in result.stderr
    assert "The above exception was the direct cause" in result.stderr


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_the_worker_starts_ends_it_cleanly(spawn, sig):
    """A SIGTERM (an orchestrator's) or Ctrl-C while runworker still started (here:
    waiting for its database) ended it by the signal's default action (-15) or a
    KeyboardInterrupt traceback; the same held in the moment between the metrics
    server and the worker's own handlers. It now stops before claiming anything."""
    proc = spawn(
        "runworker",
        f"{H}.BehaviorHandler",
        "--startup-timeout",
        "60",
        env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere"},
    )
    wait_until(lambda: "retrying in" in proc.output, 30, message=lambda: proc.output)
    proc.signal(sig)
    assert proc.wait(30) == 0, proc.output
    last = proc.output.strip().splitlines()[-1]
    assert f"{sig.name} received while waiting for database 'default': not started" in last
    assert "Traceback" not in proc.output


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_never_reaches_its_database_says_so_and_exits(spawn):
    """A wrong DATABASE_URL: one line per try while it waits, then a clear error and a
    non-zero exit, instead of retrying (and logging) forever."""
    proc = spawn(
        "runworker",
        f"{H}.BehaviorHandler",
        "--startup-timeout",
        "3",
        env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere"},
    )
    assert proc.wait(60) == 1, proc.output
    lines = proc.output.strip().splitlines()
    assert "database 'default' unreachable for 3s" in lines[-1], proc.output
    retries = [line for line in lines if "retrying in" in line]
    assert 1 <= len(retries) <= 4, proc.output
    assert len(lines) == len(retries) + 1, proc.output


def _little_address_space():
    """As a container with a tight memory limit: thread stacks cannot all be mapped."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_more_handler_threads_than_the_machine_can_start_is_a_clear_error():
    proc = manage(
        "runworker",
        f"{H}.BehaviorHandler",
        "--burst",
        "--num-handlers",
        "1000",
        database_url=database_url(),
        timeout=120,
        preexec_fn=_little_address_space,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "handler threads" in last
    assert "lower num_handlers (--num-handlers)" in last, proc.stderr
