"""Jobs that wait for a time (``process_after``: scheduled for later, or a retry's
delay): kept out of the claims' index, staged by the worker when they come due
(``runtime.stager``), and started then, not at the next poll."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dbworker.runtime.stager import Stager
from django_dbworker.sql.connection import Connection
from django_dbworker.sql.jobs import statements_for
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.projects import old_package, project  # noqa: F401 - the fixture
from tests.testapp import handlers as h
from tests.testapp.models import Event, QueueJob, UUIDJob

pytestmark = pytest.mark.django_db(transaction=True)


def ok(done):
    assert done.returncode == 0, f"{done.args}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


class SlowPollingHandler(h.BehaviorHandler):
    """Polls every 30 s: a job it starts sooner was woken by something else."""

    interval = 30.0
    max_interval = 30.0


def started_at(job_id: int) -> float | None:
    found = Event.objects.filter(job_id=job_id, kind="start").order_by("at").first()
    return None if found is None else found.at


def test_a_job_scheduled_for_later_starts_at_its_time_not_at_the_next_poll(run_worker):
    run_worker(SlowPollingHandler())
    time.sleep(0.5)  # the worker is idle: its next poll is 30 s away
    due = timezone.now() + timedelta(seconds=1.5)
    job = JobFactory(process_after=due)
    start = wait_until(lambda: started_at(job.pk), timeout=20, message="the job to start")
    assert start >= due.timestamp() - 0.05  # not before its time (the clocks are one)
    assert start < due.timestamp() + 5  # at its time, not at the next poll (30 s)
    job.refresh_from_db()
    assert job.process_after is None  # staged
    assert abs((job.queued_at - due).total_seconds()) < 0.01  # queued when it came due


def test_a_retry_starts_when_its_delay_ends_not_at_the_next_poll(run_worker):
    class RetryLater(SlowPollingHandler):
        retry_after = timedelta(seconds=1)

    job = JobFactory(behavior="fail_times", payload={"times": 1})
    run_worker(RetryLater())
    wait_until(
        lambda: QueueJob.objects.get(pk=job.pk).state == "completed",
        timeout=20,
        message="the retry to complete",
    )
    starts = list(Event.objects.filter(job_id=job.pk, kind="start").order_by("at"))
    assert len(starts) == 2
    assert 0.9 <= starts[1].at - starts[0].at < 5  # its delay, not a 30 s poll


def test_an_operator_moves_a_job_earlier_and_the_worker_starts_it_then(run_worker):
    job = JobFactory(process_after=timezone.now() + timedelta(hours=1))
    run_worker(SlowPollingHandler())
    time.sleep(0.5)  # the worker read when its next job is due: in an hour
    soon = timezone.now() + timedelta(seconds=1)
    assert QueueJob.objects.filter(pk=job.pk).schedule(soon) == 1
    start = wait_until(lambda: started_at(job.pk), timeout=20, message="the job to start")
    assert soon.timestamp() - 0.05 <= start < soon.timestamp() + 5


def test_more_jobs_due_at_once_than_one_stage_takes_all_run(run_worker, monkeypatch):
    """A million reminders due at midnight: staged a batch at a time (here 7), all
    claimed, as the worker goes on and as --burst settles before it ends."""
    monkeypatch.setattr(Stager, "batch", 7)
    past = timezone.now() - timedelta(minutes=5)
    jobs = QueueJob.objects.bulk_create(
        [QueueJob(behavior="ok", payload={}, process_after=past) for _ in range(40)]
    )
    tw = run_worker(h.BehaviorHandler(num_handlers=8), burst=True)
    assert tw.join(60) == 0
    assert QueueJob.objects.filter(state="completed").count() == len(jobs)
    later = timezone.now() + timedelta(seconds=1)
    QueueJob.objects.bulk_create(
        [QueueJob(behavior="ok", payload={}, process_after=later) for _ in range(40)]
    )
    assert run_worker(h.BehaviorHandler(num_handlers=8), until_done=True).join(60) == 0
    assert QueueJob.objects.filter(state="completed").count() == 2 * len(jobs)


def test_burst_runs_what_came_due_before_it_ends(run_worker):
    """``--burst`` stages what is due before it ends: a job whose time passed while no
    worker ran is run, one for later is left."""
    past = JobFactory(process_after=timezone.now() - timedelta(seconds=1))
    later = JobFactory(process_after=timezone.now() + timedelta(hours=1))
    assert run_worker(h.BehaviorHandler(), burst=True).join() == 0
    assert QueueJob.objects.get(pk=past.pk).state == "completed"
    assert QueueJob.objects.get(pk=later.pk).state == "queued"


def test_until_done_waits_for_a_job_scheduled_for_later(run_worker):
    job = JobFactory(process_after=timezone.now() + timedelta(seconds=1))
    assert run_worker(h.BehaviorHandler(), until_done=True).join(30) == 0
    assert QueueJob.objects.get(pk=job.pk).state == "completed"


def test_uuid_keyed_jobs_scheduled_for_later_run(run_worker):
    UUIDJob.objects.create(process_after=timezone.now() + timedelta(seconds=1))
    UUIDJob.objects.create(process_after=timezone.now() - timedelta(seconds=1))
    assert run_worker(h.UUIDHandler(), until_done=True).join(30) == 0
    assert set(UUIDJob.objects.values_list("state", flat=True)) == {"completed"}


def test_the_claim_reads_no_job_that_waits_for_a_time():
    """Whatever waits (scheduled, a retry's delay) is outside the claim: a job whose
    time has passed is claimed only once staged."""
    sql = statements_for(QueueJob, connection.vendor, "default")
    due_unstaged = JobFactory(process_after=timezone.now() - timedelta(seconds=1))
    JobFactory(process_after=timezone.now() + timedelta(days=1))
    JobFactory(state="errored", num_failures=1, process_after=timezone.now() + timedelta(days=1))
    ready = JobFactory()
    params = {"worker": "w:1:x", "max_retries": 3, "held": sql.ids_param([]), "limit": 10}
    claim = sql.claim(sql.order_by(("pk",)))
    db = Connection("default", "test")
    try:
        assert sql.keys(db.execute(claim, params)) == [ready.pk]
        assert sql.keys(db.execute(sql.stage)) == [due_unstaged.pk]
        assert sql.keys(db.execute(claim, params)) == [due_unstaged.pk]
        [(seconds,)] = db.execute(sql.next_due)
        assert 86300 < seconds < 86400
    finally:
        db.close()


# -- an upgrade, old and new workers on one table -----------------------------------------

#: The last commit whose claims read the jobs that wait for a time (before the stager).
OLD_COMMIT = "de47962"

UPGRADE_MODELS = """
from django.db import models
from django_dbworker.models import WorkerJob


class Job(WorkerJob):
    fails = models.IntegerField(default=0)
    not_before = models.DateTimeField(null=True)


class Run(models.Model):
    job_id = models.BigIntegerField()
    pid = models.IntegerField()
    at = models.DateTimeField(auto_now_add=True)
"""

UPGRADE_HANDLERS = """
import os
from datetime import timedelta

from django_dbworker import Handler

from .models import Job, Run


class JobHandler(Handler):
    model = Job
    num_handlers = 2
    interval = 0.05
    heartbeat_interval = 0.2
    stalled_max_age = 2.0
    max_num_retries = 3
    retry_after = timedelta(seconds=1)

    def handle(self, job):
        Run.objects.create(job_id=job.pk, pid=os.getpid())
        if job.num_failures < job.fails:
            raise RuntimeError("once more")
"""

UPGRADE_PROBE = """
import json
from datetime import timedelta

from django.db.models import Count
from django.utils import timezone

from .models import Job, Run


def enqueue(count, later, fails):
    after = timezone.now() + timedelta(seconds=later) if later else None
    jobs = [Job(fails=fails, process_after=after, not_before=after) for _ in range(count)]
    Job.objects.bulk_create(jobs)


def report():
    states = dict(Job.objects.values_list("state").annotate(Count("id")))
    runs = list(Run.objects.order_by("id").values_list("job_id", "pid"))
    due = dict(Job.objects.filter(not_before__isnull=False).values_list("pk", "not_before"))
    early = [
        job_id
        for job_id, at in Run.objects.values_list("job_id", "at")
        if job_id in due and at < due[job_id] - timedelta(milliseconds=50)
    ]
    print("PROBE", json.dumps({"states": states, "runs": runs, "early": early}))
"""


@pytest.mark.subprocess
@pytest.mark.timeout(240)  # Django processes of two releases, in turn
def test_old_and_new_workers_share_a_table_with_jobs_for_later(project, tmp_path):  # noqa: F811
    """The project runs the release before the stager, with jobs for later and retries
    waiting; the package is upgraded and migrated while an old worker runs; old and new
    workers drain the table together: every job runs as often as it must, none twice
    for one attempt, and the jobs for later not before their time."""
    from django.db import connection as default_connection

    if default_connection.vendor == "mysql":
        pytest.skip("the release before ran MariaDB's claims through another index layout")
    old = old_package(tmp_path, OLD_COMMIT)
    project.app("jobs", models=UPGRADE_MODELS, handlers=UPGRADE_HANDLERS, probe=UPGRADE_PROBE)

    def probe(call, package=None):
        done = ok(
            project.run("shell", "-c", f"from jobs import probe; probe.{call}", package=package)
        )
        found = [line[6:] for line in done.stdout.splitlines() if line.startswith("PROBE ")]
        return json.loads(found[-1]) if found else None

    ok(project.run("makemigrations", "jobs", package=old))
    ok(project.run("migrate", package=old))
    probe("enqueue(20, 0, 0)", package=old)  # due now
    probe("enqueue(20, 4, 0)", package=old)  # for later
    probe("enqueue(10, 0, 1)", package=old)  # each fails once, retried after 1 s
    older = project.start("runworker", "jobs.handlers.JobHandler", "-v", "2", package=old)

    # Upgraded under the running old worker: forgotten makemigrations is warned about.
    done = ok(project.run("check"))
    assert "dbworker.W010" in done.stderr, done.stderr
    ok(project.run("makemigrations", "jobs"))
    ok(project.run("migrate"))
    assert "dbworker.W010" not in ok(project.run("check")).stderr
    newer = project.start("runworker", "jobs.handlers.JobHandler", "-v", "2")
    wait_until(lambda: " started: " in newer.output, 60, message="the new worker to start")
    probe("enqueue(20, 3, 0)")  # for later, from the new release
    probe("enqueue(10, 0, 2)")  # each fails twice

    report = wait_until(
        lambda: (r := probe("report()"))["states"].get("completed") == 80 and r,
        timeout=120,
        interval=0.5,
        message="the 80 jobs to complete under an old and a new worker",
    )
    runs: dict[int, int] = {}
    for job_id, _ in report["runs"]:
        runs[job_id] = runs.get(job_id, 0) + 1
    assert sorted(runs.values()) == [1] * 60 + [2] * 10 + [3] * 10
    assert report["early"] == []  # no job for later ran before its time
    assert {pid for _, pid in report["runs"]} == {older.proc.pid, newer.proc.pid}
    for proc in (older, newer):
        proc.proc.terminate()
        assert proc.wait(60) == 0
        assert "Traceback" not in proc.output, proc.output
