"""Heartbeats against the clock: long handlers, busy handlers, and a heartbeat (or
writer) thread that dies while its process lives on."""

import signal

import pytest

from tests.testapp.models import QueueJob

from .conftest import Fleet, audit, counts, say, unfinished, wait_exit, wait_for, worker_id

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.ChaosHandler"  # heartbeat 0.25 s, stalled_max_age 3 s


def started_by(job, worker):
    from tests.testapp.models import Event

    return Event.objects.filter(job_id=job.pk, kind="start", worker=worker).exists()


@pytest.mark.timeout(120)
def test_handlers_busy_past_stalled_max_age_are_never_reset(spawn):
    """Blocking (time.sleep) and busy (pure Python loop) handlers run 2x stalled_max_age
    while the heartbeat thread keeps beating; a resetter runs all along."""
    QueueJob.objects.bulk_create(
        [QueueJob(behavior="block", payload={"seconds": 7}) for _ in range(3)]
        + [QueueJob(behavior="spin", payload={"seconds": 7}) for _ in range(3)]
    )
    resetter = spawn("runresetter", HANDLER, "--interval", "0.3")
    fleet = Fleet(spawn, HANDLER, 2, "--no-resetter", "--num-handlers", "3")
    wait_for(lambda: unfinished() == 0, 60, "the long jobs")
    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0
    report = audit({}, resetter.output)
    assert report.problems == []
    assert report.resets == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("no_resetter", [False, True], ids=["own-resetter", "no-resetter"])
def test_a_worker_whose_heartbeat_thread_dies_stops_before_its_jobs_are_reset(spawn, no_resetter):
    """The worker cannot keep its jobs alive any more: it must stop running them before
    the resetter hands them to another worker (no overlap), and exit 1."""
    dying = QueueJob.objects.create(behavior="kill_heartbeat", payload={"seconds": 10})
    # Fill every slot, so nothing else wakes the worker's dispatcher.
    blocked = QueueJob.objects.create(behavior="block", payload={"seconds": 10, "first_only": True})
    resetter = spawn("runresetter", HANDLER, "--interval", "0.3")
    args = ["--num-handlers", "2"] + (["--no-resetter"] if no_resetter else [])
    first = spawn("runworker", HANDLER, *args)
    first_id = worker_id(first)
    wait_for(lambda: started_by(dying, first_id) and started_by(blocked, first_id), 30, "start")
    # Ready to take the jobs as soon as the resetter brings them back.
    second = spawn("runworker", HANDLER, "--num-handlers", "2", "--no-resetter")
    code, died = wait_exit(first, 30)
    assert code == 1, first.output
    assert "the heartbeat thread died" in first.output
    wait_for(lambda: unfinished() == 0, 60, "the jobs to run again")
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0
    assert {j.num_resets for j in QueueJob.objects.all()} == {1}
    report = audit({int(first_id.split(":")[1]): died}, resetter.output)
    say(f"heartbeat died: exited {code}; problems {report.problems}")
    assert report.problems == []


@pytest.mark.timeout(120)
def test_a_worker_whose_writer_thread_dies_stops_and_its_jobs_come_back(spawn):
    """Outcomes could never be written: rather than hold (and heartbeat) its jobs
    forever, the worker stops and leaves them to the resetter."""
    dying = QueueJob.objects.create(behavior="kill_writer")
    others = QueueJob.objects.bulk_create(QueueJob(behavior="sleep") for _ in range(5))
    resetter = spawn("runresetter", HANDLER, "--interval", "0.3")
    first = spawn("runworker", HANDLER, "--num-handlers", "2", "--no-resetter")
    first_id = worker_id(first)
    wait_for(lambda: started_by(dying, first_id), 30, "the job to start")
    second = spawn("runworker", HANDLER, "--no-resetter")
    code, died = wait_exit(first, 30)
    assert code == 1, first.output
    assert "the outcome writer thread died" in first.output
    wait_for(lambda: unfinished() == 0, 60, "the jobs to finish")
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0
    assert QueueJob.objects.filter(state="completed").count() == 1 + len(others), counts()
    report = audit({int(first_id.split(":")[1]): died}, resetter.output)
    assert report.problems == []
