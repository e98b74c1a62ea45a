"""runworker --processes N: a supervisor over N real worker processes."""

import os
import re
import signal

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.models import QueueJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

HANDLER = "tests.testapp.handlers.BehaviorHandler"
STARTED = re.compile(r"started worker process (\d+)")


def pids_of_jobs():
    hosts = QueueJob.objects.exclude(worker_hostname="").values_list("worker_hostname", flat=True)
    return {host.split(":")[1] for host in hosts}


def test_processes_share_the_work_and_exit_0_in_burst_mode(spawn):
    JobFactory.create_batch(120, behavior="sleep", payload={"seconds": 0.02})
    sup = spawn("runworker", HANDLER, "--processes", "2", "--burst", "--no-resetter")
    assert sup.wait(120) == 0, sup.output
    assert set(QueueJob.objects.values_list("state", flat=True)) == {"completed"}
    assert len(pids_of_jobs()) == 2
    assert len(STARTED.findall(sup.output)) == 2


def test_sigterm_drains_every_process(spawn):
    JobFactory.create_batch(6, behavior="sleep", payload={"seconds": 1.5})
    sup = spawn("runworker", HANDLER, "--processes", "2", "--no-resetter")
    wait_until(lambda: QueueJob.objects.filter(state="processing").count() >= 2, 30)
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.output
    assert not QueueJob.objects.filter(state="processing").exists()
    assert QueueJob.objects.filter(state="completed").count() >= 2


def test_a_crashed_process_is_restarted(spawn):
    sup = spawn("runworker", HANDLER, "--processes", "2", "--no-resetter")
    wait_until(lambda: len(STARTED.findall(sup.output)) == 2, 30, message="two workers")
    os.kill(int(STARTED.findall(sup.output)[0]), signal.SIGKILL)
    wait_until(lambda: len(STARTED.findall(sup.output)) == 3, 30, message="a restart")
    assert "was killed by SIGKILL; restarting it" in sup.output
    job = JobFactory()
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "completed", 30)
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.output


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--processes", "0", "--processes must be > 0, not '0'"),
        ("--processes", "x", "--processes must be a number, not 'x'"),
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
