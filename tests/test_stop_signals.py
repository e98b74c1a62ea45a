"""How runworker counts its stop signals and ends under --reload (issue 42, item 23).

A signal's copies (a process manager or ``kill`` signalling the process group or the
cgroup, and the supervisor forwarding it; ``timeout -s INT``, which signals the command
and then its group) arrive milliseconds apart: they drain, as one signal does. A
second signal past ``REPEAT_WINDOW`` still stops the jobs (tests/test_processes.py).
With ``--reload`` and ``--until-done``/``--burst``, a crashed worker ends the
supervisor instead of leaving it waiting for a file to change."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from django_dbworker.runtime.signals import REPEAT_WINDOW
from django_dbworker.runtime.supervisor import Supervisor
from tests import conftest
from tests.conftest import ROOT, descendants, wait_until
from tests.factories import JobFactory
from tests.testapp.models import QueueJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

HANDLER = "tests.testapp.handlers.BehaviorHandler"
STARTED = re.compile(r"started worker process (\d+)")
WORKER_STARTED = re.compile(r"worker [^ ]+ started: ")


class Leader:
    """``manage.py runworker`` leading a process group (and session) of its own, as a
    service manager, a shell's job or ``timeout`` starts it."""

    def __init__(self, *args):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="dbw-", suffix=".log")  # noqa: SIM115
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
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def output(self):
        if self.log.closed:
            return self.text
        self.log.flush()
        return Path(self.log.name).read_text()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"runworker did not exit in {timeout}s:\n{self.output}")

    def close(self):
        if self.proc.poll() is None:
            for pid in [*descendants(self.proc.pid), self.proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(10)
        self.text = self.output
        self.log.close()


def running(n):
    return lambda: QueueJob.objects.filter(state="processing").count() >= n


def test_a_signal_to_the_worker_and_its_group_drains(  # the way `timeout -s INT` sends it
):
    job = JobFactory(behavior="sleep", payload={"seconds": 2})
    worker = Leader(HANDLER, "--no-resetter")
    try:
        wait_until(running(1), 30, message="the job to start")
        os.kill(worker.proc.pid, signal.SIGINT)
        # Apart enough that the kernel delivers both (a signal sent while the same one
        # is still pending is merged into it), well within the window.
        time.sleep(0.05)
        os.killpg(worker.proc.pid, signal.SIGINT)
        assert worker.wait(60) == 0, worker.output
    finally:
        worker.close()
    assert QueueJob.objects.get(pk=job.pk).state == "completed", worker.output
    assert "SIGINT received, draining" in worker.output
    assert "ms after the first signal: the same stop" in worker.output
    assert "stopping jobs now" not in worker.output


def test_the_same_signal_to_the_supervisor_and_its_workers_drains():
    """systemd's KillMode=control-group signals every process of the service at once:
    each worker gets SIGTERM from it and again from the supervisor."""
    jobs = JobFactory.create_batch(2, behavior="sleep", payload={"seconds": 2})
    sup = Leader(HANDLER, "--processes", "2", "--no-resetter", "--num-handlers", "1")
    try:
        wait_until(lambda: len(WORKER_STARTED.findall(sup.output)) >= 2, 30, message="workers")
        wait_until(running(2), 30, message="a job in each worker")
        workers = [int(pid) for pid in STARTED.findall(sup.output)]
        for pid in workers:  # as a cgroup's kill: every process
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.05)  # (apart enough not to be merged with the supervisor's forward)
        os.kill(sup.proc.pid, signal.SIGTERM)
        time.sleep(0.05)
        os.killpg(sup.proc.pid, signal.SIGTERM)  # and the supervisor's group again
        assert sup.wait(60) == 0, sup.output
    finally:
        sup.close()
    states = [QueueJob.objects.get(pk=job.pk).state for job in jobs]
    assert states == ["completed", "completed"], sup.output
    assert "stopping their jobs now" not in sup.output
    assert "stopping jobs now" not in sup.output
    assert sup.output.count("SIGTERM received, draining") == 2, sup.output
    assert sup.output.count("ms after the first signal: the same stop") >= 2, sup.output


def test_a_signal_again_past_the_window_still_stops_the_jobs():
    job = JobFactory(behavior="sleep", payload={"seconds": 60})
    worker = Leader(HANDLER, "--no-resetter")
    try:
        wait_until(running(1), 30, message="the job to start")
        os.killpg(worker.proc.pid, signal.SIGINT)
        time.sleep(REPEAT_WINDOW + 0.5)
        os.killpg(worker.proc.pid, signal.SIGINT)
        assert worker.wait(60) == 0, worker.output
    finally:
        worker.close()
    assert QueueJob.objects.get(pk=job.pk).state == "queued"  # requeued when stopped
    assert "SIGINT received again, stopping jobs now" in worker.output


@pytest.mark.parametrize("mode", ["--until-done", "--burst"])
def test_with_reload_a_crashed_worker_ends_the_supervisor(mode):
    """It logged "waiting for a file to change" and never ended."""
    JobFactory(behavior="crash")
    sup = Leader(HANDLER, "--reload", mode, "--no-resetter")
    try:
        assert sup.wait(60) == 1, sup.output
    finally:
        sup.close()
    assert "exited with -9; not waiting for a file to change" in sup.output, sup.output
    assert "waiting for a file to change;" not in sup.output


def test_with_watch_and_finishes_the_supervisor_ends_with_the_childs_code():
    sup = Supervisor(
        [sys.executable, "-c", "import sys; sys.exit(3)"],
        1,
        grace=10,
        install_signal_handlers=False,
        restart=False,
        watch=lambda: None,
        finishes=True,
    )
    started = time.monotonic()
    assert sup.run() == 3
    assert time.monotonic() - started < 20
