"""Another transaction holds row locks on some jobs for a long time."""

import signal
import time

import pytest

from tests.testapp.models import QueueJob

from .conftest import (
    ON_POSTGRES,
    ROW_LOCKS_ONLY,
    Fleet,
    audit,
    row_locks,
    say,
    scale,
    unfinished,
    wait_for,
)

pytestmark = [
    pytest.mark.chaos,
    *ROW_LOCKS_ONLY,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.ChaosHandler"  # heartbeat 0.25 s, stalled_max_age 3 s
LOCK_SECONDS = 12  # past stalled_max_age and the workers' 10 s statement timeout
#: How long the queued jobs stay locked while the others run: the fleet starts inside it
#: (on a loaded CI host with coverage, starting two workers took most of 12 s).
QUEUED_LOCK_SECONDS = 40


def short_jobs(n):
    return QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": 0.02}) for _ in range(n)
    )


def stop(fleet, resetter):
    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0, resetter.output
    return fleet.output() + resetter.output


@pytest.mark.timeout(120)
def test_locked_queued_jobs_are_skipped_and_nothing_else_waits(spawn):
    locked = short_jobs(20)  # first in claim order
    others = short_jobs(scale(300, 1000))
    resetter = spawn("runresetter", HANDLER, "--interval", "0.5")
    with row_locks([job.pk for job in locked]):
        fleet = Fleet(spawn, HANDLER, 2, "--num-handlers", "4")
        wait_for(
            lambda: QueueJob.objects.filter(state="completed").count() == len(others),
            QUEUED_LOCK_SECONDS,
            "the unlocked jobs to complete while the others are locked",
        )
        assert QueueJob.objects.filter(pk__in=[j.pk for j in locked], state="queued").count() == 20
    wait_for(lambda: unfinished() == 0, 30, "the locked jobs once released")
    output = stop(fleet, resetter)
    report = audit({}, output)
    assert report.problems == []
    assert report.resets == 0


@pytest.mark.timeout(120)
def test_running_jobs_locked_past_stalled_max_age_stall_nothing_and_are_not_reset(spawn):
    long_jobs = QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": 2.0}) for _ in range(4)
    )
    resetter = spawn("runresetter", HANDLER, "--interval", "0.5")
    fleet = Fleet(spawn, HANDLER, 2, "--num-handlers", "4")
    ids = [job.pk for job in long_jobs]
    wait_for(
        lambda: QueueJob.objects.filter(pk__in=ids, state="processing").count() == 4,
        30,
        "the long jobs to start",
    )
    with row_locks(ids):
        started = time.monotonic()
        # They finish while locked: their outcomes must wait without holding up others.
        others = short_jobs(scale(300, 1000))
        wait_for(
            lambda: QueueJob.objects.filter(state="completed").count() == len(others),
            LOCK_SECONDS - 2,
            "the other jobs to complete while 4 running jobs are locked",
        )
        say(f"{len(others)} other jobs done {time.monotonic() - started:.1f}s into the lock")
        time.sleep(max(0.0, LOCK_SECONDS - (time.monotonic() - started)))
    wait_for(lambda: unfinished() == 0, 30, "the locked jobs once released")
    output = stop(fleet, resetter)
    report = audit({}, output)
    say(f"locked running jobs: {report.resets} resets, problems {report.problems}")
    assert report.problems == []
    assert report.resets == 0


@pytest.mark.timeout(120)
@pytest.mark.skipif(not ON_POSTGRES, reason="FOR KEY SHARE: PostgreSQL only")
def test_a_foreign_key_lock_does_not_stop_the_heartbeat(spawn):
    """FOR KEY SHARE (what inserting a child row that references the job takes) must not
    keep the worker from heartbeating the job."""
    jobs = QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": 8.0}) for _ in range(2)
    )
    ids = [job.pk for job in jobs]
    resetter = spawn("runresetter", HANDLER, "--interval", "0.5")
    fleet = Fleet(spawn, HANDLER, 1, "--num-handlers", "2")
    wait_for(
        lambda: QueueJob.objects.filter(pk__in=ids, state="processing").count() == 2,
        30,
        "the jobs to start",
    )

    def beats():
        return dict(QueueJob.objects.filter(pk__in=ids).values_list("pk", "last_heartbeat_at"))

    with row_locks(ids, "FOR KEY SHARE"):
        before = beats()
        time.sleep(4)  # past stalled_max_age
        after = beats()
    assert all(after[pk] > before[pk] for pk in ids), (before, after)
    wait_for(lambda: unfinished() == 0, 30, "the jobs to finish")
    output = stop(fleet, resetter)
    report = audit({}, output)
    assert report.problems == []
    assert report.resets == 0
