"""What a new user meets in the first hour: Ctrl-C in a terminal, --reload, a worker
that ends when its jobs are done, the metrics' default address."""

import contextlib
import fcntl
import os
import pty
import signal
import subprocess
import sys
import termios
import textwrap
import threading
import time

import pytest

from django_dbworker.runtime.signals import REPEAT_WINDOW
from tests import conftest
from tests.conftest import ROOT, wait_until
from tests.factories import JobFactory
from tests.testapp.models import Event, QueueJob

from .projects import project  # noqa: F401 - the fixture

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]


class InTerminal:
    """``runworker`` as a shell runs it in a terminal: a pty is its controlling terminal
    and it is the terminal's foreground process group (what Ctrl-C reaches)."""

    def __init__(self, *args: str) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.output = b""

        def become_the_terminals() -> None:
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)

        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": conftest.test_database_url(),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("DBWORKER_SUPERVISED", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runworker", *args, "-v", "1"],
            cwd=ROOT,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=become_the_terminals,
        )
        os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(self.master, 4096):
                self.output += chunk

    def ctrl_c(self) -> None:
        """What pressing Ctrl-C does: the terminal sends SIGINT to its foreground group."""
        os.write(self.master, b"\x03")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"runworker did not exit in {timeout}s:\n{self.text}")

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


def events(job):
    kinds = Event.objects.filter(job_id=job.pk).values_list("kind", flat=True)
    return [kind for kind in kinds if kind not in ("start", "end")]


def test_ctrl_c_in_a_terminal_drains_without_touching_what_handlers_started():
    """The terminal's Ctrl-C reached the processes the handler started too (they are in
    the worker's process group): the job's `sleep` died with SIGINT and the job failed
    instead of being drained."""
    job = JobFactory(behavior="ok", payload={"seconds": 2})
    worker = InTerminal("tests.testapp.handlers.CommandHandler")
    try:
        wait_until(lambda: "command_started" in events(job), 30, message="the job to start")
        worker.ctrl_c()
        assert worker.wait(60) == 0, worker.text
    finally:
        worker.close()
    assert events(job) == ["command_started", "command_exit:0", "post_handle:completed"]
    assert QueueJob.objects.get(pk=job.pk).state == "completed"
    assert "SIGINT received; worker processes are draining" in worker.text


def test_a_second_ctrl_c_still_stops_the_jobs():
    job = JobFactory(behavior="sleep", payload={"seconds": 60})
    worker = InTerminal("tests.testapp.handlers.BehaviorHandler")
    try:
        wait_until(
            lambda: QueueJob.objects.get(pk=job.pk).state == "processing", 30, message="a claim"
        )
        time.sleep(0.3)
        worker.ctrl_c()
        time.sleep(REPEAT_WINDOW + 0.3)  # sooner, it is taken for a copy of the first
        worker.ctrl_c()
        assert worker.wait(60) == 0, worker.text
    finally:
        worker.close()
    assert QueueJob.objects.get(pk=job.pk).state == "queued"  # requeued when stopped


def test_until_done_waits_for_the_retries_then_ends(spawn):
    """``--burst`` ends when nothing is claimable now: a job whose retry is due in a
    second is left behind. ``--until-done`` (what ``make demo`` runs) ends when every
    job is done."""
    job = JobFactory(behavior="fail_times", payload={"times": 2})
    handler = "tests.testapp.handlers.SlowRetryHandler"
    assert spawn("runworker", handler, "--burst").wait(60) == 0
    assert QueueJob.objects.get(pk=job.pk).state == "errored"  # left for later
    proc = spawn("runworker", handler, "--until-done", "--max-time", "60")
    assert proc.wait(60) == 0, proc.output
    assert QueueJob.objects.get(pk=job.pk).state == "completed"
    assert QueueJob.objects.get(pk=job.pk).num_failures == 2


def test_the_metrics_are_served_on_the_loopback_address_by_default():
    from django_dbworker.management.commands.runworker import Command

    parser = Command().create_parser("manage.py", "runworker")
    assert parser.get_default("metrics_address") == "127.0.0.1"


HANDLERS = """
from django_dbworker import Handler

from .models import Job, Run

VERSION = {version}


class JobHandler(Handler):
    model = Job
    interval = 0.05
    heartbeat_interval = 0.2
    stalled_max_age = 2.0

    def handle(self, job):
        Run.objects.create(job_id=job.pk, pid=VERSION)
"""

MODELS = """
from django.db import models
from django_dbworker.models import WorkerJob


class Job(WorkerJob):
    pass


class Run(models.Model):
    job_id = models.BigIntegerField()
    pid = models.IntegerField()
"""


@pytest.mark.django_db(transaction=False)
def test_reload_restarts_the_worker_when_the_code_changes(project):  # noqa: F811
    path = project.app("jobs", models=MODELS, handlers=HANDLERS.format(version=1))
    assert project.run("makemigrations", "jobs").returncode == 0
    assert project.run("migrate").returncode == 0
    worker = project.start("runworker", "jobs.handlers.JobHandler", "--reload", "-v", "1")

    def runs():
        done = project.run(
            "shell",
            "-c",
            "from jobs.models import Run; print(sorted(Run.objects.values_list('pid', flat=True)))",
        )
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    def enqueue():
        assert (
            project.run(
                "shell", "-c", "from jobs.models import Job; Job.objects.create()"
            ).returncode
            == 0
        )

    enqueue()
    wait_until(lambda: runs() == "[1]", 30, interval=0.3, message="version 1 to run a job")
    time.sleep(1.1)  # a new modification time
    (path / "handlers.py").write_text(textwrap.dedent(HANDLERS.format(version=2)))
    wait_until(
        lambda: "handlers.py changed; restarting the worker process" in worker.output,
        30,
        interval=0.3,
        message="the supervisor to see the change",
    )
    enqueue()
    wait_until(lambda: runs() == "[1, 2]", 30, interval=0.3, message="version 2 to run a job")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output
