"""runworker --processes N: a supervisor over N real worker processes."""

import functools
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
from django.core.management import CommandError, call_command

from django_dbworker.runtime.supervisor import Supervisor
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.models import QueueJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

HANDLER = "tests.testapp.handlers.BehaviorHandler"
STARTED = re.compile(r"started worker process (\d+)")
WORKER_STARTED = re.compile(r"worker [^ ]+ started: ")


def pids_of_jobs():
    hosts = QueueJob.objects.exclude(worker_hostname="").values_list("worker_hostname", flat=True)
    return {host.split(":")[1] for host in hosts}


def running(n):
    return lambda: QueueJob.objects.filter(state="processing").count() >= n


def workers_up(sup, n=2):
    """Both children are workers by now (a signal no longer finds one starting)."""
    return lambda: len(WORKER_STARTED.findall(sup.output)) >= n


def test_processes_share_the_work_and_exit_0_in_burst_mode(spawn):
    # 2.5 s of work for one process alone: the other one starts well before the end.
    JobFactory.create_batch(40, behavior="sleep", payload={"seconds": 0.25})
    sup = spawn("runworker", HANDLER, "--processes", "2", "--burst", "--no-resetter")
    assert sup.wait(120) == 0, sup.output
    assert set(QueueJob.objects.values_list("state", flat=True)) == {"completed"}
    assert len(pids_of_jobs()) == 2
    assert len(STARTED.findall(sup.output)) == 2


def test_sigterm_drains_every_process(spawn):
    JobFactory.create_batch(6, behavior="sleep", payload={"seconds": 1.5})
    sup = spawn("runworker", HANDLER, "--processes", "2", "--no-resetter")
    wait_until(running(2), 30, message="jobs running")
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.output
    assert not QueueJob.objects.filter(state="processing").exists()
    assert QueueJob.objects.filter(state="completed").count() >= 2


def test_a_crashed_process_is_restarted(spawn):
    sup = spawn("runworker", HANDLER, "--processes", "2", "--no-resetter")
    wait_until(lambda: len(STARTED.findall(sup.output)) == 2, 30, message="two workers")
    first, second = STARTED.findall(sup.output)
    os.kill(int(first), signal.SIGKILL)
    wait_until(lambda: len(STARTED.findall(sup.output)) == 3, 30, message="a restart")
    assert f"worker process {first} was killed by SIGKILL; restarting it in 1s" in sup.output
    new = STARTED.findall(sup.output)[2]
    assert new not in (first, second)
    wait_until(lambda: f":{new}:" in sup.output, 30, message="the new worker's start")
    JobFactory.create_batch(8)
    wait_until(
        lambda: not QueueJob.objects.exclude(state="completed").exists(), 30, message="the jobs"
    )
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.output


def test_ctrl_c_in_a_terminal_counts_once(spawn, monkeypatch):
    """A terminal sends SIGINT to its foreground process group: the children, in
    their own session, get it only from the supervisor, once, so they drain."""
    job = JobFactory(behavior="sleep", payload={"seconds": 2})
    with monkeypatch.context() as patched:  # the supervisor leads its own group
        patched.setattr(
            subprocess, "Popen", functools.partial(subprocess.Popen, start_new_session=True)
        )
        sup = spawn("runworker", HANDLER, "--processes", "2", "--no-resetter")
    wait_until(running(1), 30, message="the job")
    wait_until(workers_up(sup), 30, message="two workers")
    os.killpg(sup.proc.pid, signal.SIGINT)
    assert sup.wait(60) == 0, sup.output
    job.refresh_from_db()
    assert job.state == "completed"
    assert sup.output.count("SIGINT received, draining") == 2, sup.output
    assert "received again" not in sup.output


def test_sighup_drains_instead_of_orphaning_the_processes(spawn):
    job = JobFactory(behavior="sleep", payload={"seconds": 2})
    sup = spawn("runworker", HANDLER, "--processes", "2", "--no-resetter")
    wait_until(running(1), 30, message="the job")
    wait_until(workers_up(sup), 30, message="two workers")
    sup.signal(signal.SIGHUP)
    assert sup.wait(60) == 0, sup.output
    job.refresh_from_db()
    assert job.state == "completed"
    assert "SIGHUP received; worker processes are draining" in sup.output
    for pid in STARTED.findall(sup.output):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


CHILD = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_signal_while_a_child_is_being_started_reaches_it():
    class SignalledWhileStarting(Supervisor):
        def _start(self, child):
            if child.slot == 0:
                self.stop()  # as if SIGTERM came in before child.proc was set
            super()._start(child)

    sup = SignalledWhileStarting(
        [sys.executable, "-c", CHILD], 2, grace=30, install_signal_handlers=False
    )
    result = []
    thread = threading.Thread(target=lambda: result.append(sup.run()), daemon=True)
    thread.start()
    thread.join(20)  # without the catch-up it runs until the grace period kills it
    assert not thread.is_alive(), "the child never got the signal"
    assert result == [0]
    assert [child.signalled for child in sup.children] == [1, 0]  # the second never started


def test_bad_handlers_fail_once_before_any_process_starts(spawn):
    sup = spawn("runworker", "tests.testapp.handlers.Nope", "--processes", "2")
    assert sup.wait(30) == 1
    assert sup.output.count("CommandError") == 1, sup.output
    assert "started worker process" not in sup.output


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--processes", "0", "--processes must be > 0, not '0'"),
        ("--processes", "x", "--processes must be a whole number, not 'x'"),
        ("--prefetch", "-1", "--prefetch must be >= 0, not '-1'"),
    ],
)
def test_bad_values_are_one_line_errors(option, value, message):
    with pytest.raises(CommandError) as info:
        call_command("runworker", HANDLER, option, value)
    assert str(info.value) == message


def test_prefetch_option_overrides_the_handler():
    from django_dbworker.management.commands._options import load_handlers

    (handler,) = load_handlers([HANDLER], prefetch=7)
    assert handler.prefetch == 7
