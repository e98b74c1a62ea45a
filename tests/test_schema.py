"""A job model's schema against WorkerJob's fields, its migrations and its table; an
upgrade of django_dbworker as a user's project goes through it, old and new workers on
one table."""

import json

import pytest
from django.db import models
from django.test.utils import isolate_apps

from django_dbworker import schema
from django_dbworker.checks import check_job_models
from django_dbworker.models import WorkerJob
from tests.testapp.models import ManagedJob, QueueJob

from .conftest import wait_until
from .projects import ROOT, old_package, project  # noqa: F401 - the fixture

#: A commit of django_dbworker from before WorkerJob gained ``progress`` and ``history``
#: (2026-11-23): the "older release" of the upgrade tests.
OLD_COMMIT = "b93af43"


def problems(model):
    return [(m.id, m.msg) for m in check_job_models() if m.obj is model]


@isolate_apps("tests.testapp")
def test_a_field_of_the_users_named_like_one_of_workerjobs_is_refused():
    class Job(WorkerJob):
        progress = models.IntegerField(default=0)
        history = models.TextField(default="")

        class Meta(WorkerJob.Meta):
            app_label = "testapp"

    found = {c.name: c.differences for c in schema.clashes(Job)}
    assert set(found) == {"progress", "history"}
    assert "IntegerField (WorkerJob's is a JSONField)" in found["progress"][0]
    message, hint = schema.clash_message(schema.clashes(Job)[0])
    assert message.startswith("testapp.Job.progress replaces WorkerJob's field 'progress'")
    assert "Rename your field" in hint
    assert "progress, history" in hint


@isolate_apps("tests.testapp")
def test_a_nullable_field_of_the_users_in_workerjobs_column_is_warned_about():
    class Job(WorkerJob):
        progress = models.JSONField(null=True, blank=True)  # the user's own, same shape
        state = models.CharField(max_length=16)  # no default, no db_default: unusable
        cancel = models.BooleanField(default=False)  # no db_default: plain SQL inserts fail

        class Meta(WorkerJob.Meta):
            app_label = "testapp"

    found = {c.name: c.differences for c in schema.clashes(Job)}
    assert found["progress"] == ()  # only the warning: the same field, the same column
    assert "db_default=unset ('queued' in WorkerJob)" in found["state"]
    assert any(d.startswith("db_default=") for d in found["cancel"])


@isolate_apps("tests.testapp")
def test_a_method_named_like_a_field_of_workerjobs_is_refused():
    class Job(WorkerJob):
        def cancel(self):  # type: ignore[override]
            pass

        class Meta(WorkerJob.Meta):
            app_label = "testapp"

    [clash] = schema.clashes(Job)
    assert clash.name == "cancel"
    assert clash.differences == ("a function (not a field)",)


def test_workerjobs_fields_declared_again_in_other_columns_are_allowed():
    # The documented way to rename a column (ManagedJob runs through the worker in the
    # other tests): only its column differs.
    assert schema.clashes(ManagedJob) == []
    assert problems(ManagedJob) == []
    assert schema.clashes(QueueJob) == []


@isolate_apps("tests.testapp")
def test_a_wider_column_is_a_compatible_redeclaration():
    class Job(WorkerJob):
        worker_hostname = models.CharField(
            max_length=500, default="", db_default="", blank=True, db_column="worker"
        )
        failure_message = models.TextField(null=True, blank=True, db_column="err")  # noqa: DJ001

        class Meta(WorkerJob.Meta):
            app_label = "testapp"

    assert schema.clashes(Job) == []


def test_the_reserved_names_are_workerjobs_fields_and_documented():
    from django_dbworker.models import BOOKKEEPING_FIELDS

    assert schema.RESERVED_NAMES == BOOKKEEPING_FIELDS
    reference = (ROOT / "docs" / "reference.md").read_text()
    for name in schema.RESERVED_NAMES:
        assert f"| `{name}` |" in reference, name


JOB_MODELS = """
from django.db import models
from django_dbworker.models import WorkerJob


class Job(WorkerJob):
    n = models.IntegerField(default=0)
    {extra}


class Run(models.Model):
    job_id = models.BigIntegerField()
    pid = models.IntegerField()
"""

HANDLERS = """
import os
import time

from django_dbworker import Handler

from .models import Job, Run


class JobHandler(Handler):
    model = Job
    num_handlers = 2
    interval = 0.05
    heartbeat_interval = 0.2
    stalled_max_age = 2.0

    def handle(self, job):
        Run.objects.create(job_id=job.pk, pid=os.getpid())
        time.sleep(job.n / 1000)
"""


@pytest.mark.subprocess
def test_check_migrate_and_runworker_refuse_a_clashing_field(project):  # noqa: F811
    project.app(
        "jobs",
        models=JOB_MODELS.format(extra="progress = models.IntegerField(default=0)"),
        handlers=HANDLERS,
    )
    for command in (["check"], ["migrate"], ["runworker", "jobs.handlers.JobHandler"]):
        done = project.run(*command)
        assert done.returncode != 0, command
        assert "dbworker.E013" in done.stderr, (command, done.stderr)
        assert "jobs.Job.progress replaces WorkerJob's field 'progress'" in done.stderr


def ok(done):
    assert done.returncode == 0, f"{done.args}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


PROBE = """
import json
import sys
import time

from django.db.models import Count

from .models import Job, Run


def enqueue(count, n):
    Job.objects.bulk_create([Job(n=n) for _ in range(count)])


def counts():
    states = dict(Job.objects.values_list("state").annotate(Count("id")))
    runs = list(Run.objects.order_by("id").values_list("job_id", "pid"))
    print("PROBE", json.dumps({"states": states, "runs": runs}))


def first_reset(timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = Job.objects.filter(num_resets__gt=0).first()
        if job is not None:
            print("PROBE", json.dumps([job.num_resets, job.history[-1]["outcome"]]))
            return
        time.sleep(0.2)
    sys.exit("no job was reset")
"""


@pytest.mark.subprocess
@pytest.mark.timeout(240)  # about ten Django processes of two releases, in turn
def test_an_upgrade_from_an_older_release_with_old_and_new_workers_on_one_table(
    project,  # noqa: F811
    tmp_path,
):
    """The project runs the older release; django_dbworker is upgraded and makemigrations
    forgotten (check warns, runworker refuses in one line), then done; during the rolling
    deploy an old and a new worker share the table, and the new one's resetter brings
    back the jobs of an old worker killed with SIGKILL."""
    from django.db import connection as default_connection

    if default_connection.vendor == "mysql":
        pytest.skip("the previous release ran on PostgreSQL and SQLite only (dbworker.E006)")
    old = old_package(tmp_path, OLD_COMMIT)
    project.app("jobs", models=JOB_MODELS.format(extra=""), handlers=HANDLERS, probe=PROBE)

    def probe(call, package=None, timeout=120):
        done = ok(
            project.run(
                "shell",
                "-c",
                f"from jobs import probe; probe.{call}",
                package=package,
                timeout=timeout,
            )
        )
        found = [line[6:] for line in done.stdout.splitlines() if line.startswith("PROBE ")]
        return json.loads(found[-1]) if found else None

    where = "import django_dbworker; print(django_dbworker.__file__)"
    assert str(old) in ok(project.run("shell", "-c", where, package=old)).stdout
    ok(project.run("makemigrations", "jobs", package=old))
    ok(project.run("migrate", package=old))

    # The new release: its own migrations applied, the project's forgotten.
    done = ok(project.run("check"))
    assert "dbworker.W005" in done.stderr
    assert "lack the fields num_snoozes, progress, history of WorkerJob" in done.stderr
    assert "python manage.py makemigrations jobs" in done.stderr
    ok(project.run("migrate"))
    refused = project.run("runworker", "jobs.handlers.JobHandler", "--burst")
    assert refused.returncode == 1
    assert (
        "jobs_job lacks columns num_snoozes, progress, history of jobs.Job: run `python manage.py "
        "makemigrations jobs`, then `python manage.py migrate`"
    ) in refused.stderr
    assert refused.stderr.count("lacks columns") == 1, refused.stderr  # one line, not a loop
    assert "Traceback" not in refused.stderr

    # An old worker runs on while the deploy goes on (and the old site enqueues).
    probe("enqueue(40, 20)", package=old)
    older = project.start("runworker", "jobs.handlers.JobHandler", "-v", "2", package=old)
    ok(project.run("makemigrations", "jobs"))
    assert sorted((project.root / "jobs" / "migrations").glob("0002_*.py"))
    ok(project.run("migrate"))
    newer = project.start("runworker", "jobs.handlers.JobHandler", "-v", "2")
    # Enqueued before the new worker runs, the 60 jobs could all go to the old one (a
    # loaded CI host took longer to start the new worker than the old one to drain them).
    wait_until(lambda: " started: " in newer.output, 60, message="the new worker to start")
    probe("enqueue(60, 20)")

    state = wait_until(
        lambda: (c := probe("counts()"))["states"].get("completed") == 100 and c,
        timeout=90,
        interval=0.5,
        message="the 100 jobs to complete under an old and a new worker",
    )
    runs: dict[int, list[int]] = {}
    for job_id, pid in state["runs"]:
        runs.setdefault(job_id, []).append(pid)
    assert len(runs) == 100
    assert [job for job, pids in runs.items() if len(pids) != 1] == []
    assert {pids[0] for pids in runs.values()} == {older.proc.pid, newer.proc.pid}

    # The old worker dies holding jobs: the new one's resetter brings them back.
    probe("enqueue(6, 30000)")
    wait_until(
        lambda: older.proc.pid in [pid for _, pid in probe("counts()")["runs"][100:]],
        timeout=30,
        message="the old worker to take one of the long jobs",
    )
    older.proc.kill()
    older.wait(10)
    assert probe("first_reset(60)", timeout=90) == [1, "reset"]
    newer.proc.terminate()
    assert newer.wait(60) == 0  # its running jobs requeued at shutdown
    assert "Traceback" not in newer.output, newer.output
