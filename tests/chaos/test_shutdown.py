"""SIGTERM while handlers run, under load; a second SIGTERM."""

import random
import signal
import time

import pytest

from django_dbworker.runtime.signals import REPEAT_WINDOW
from tests.testapp.models import Event, QueueJob

from .conftest import Fleet, audit, unfinished, wait_exit, wait_for, worker_env, worker_id

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.ChaosHandler"


def processing_by(worker):
    return QueueJob.objects.filter(state="processing", worker_hostname=worker).count()


@pytest.mark.timeout(120)
def test_sigterm_under_load_finishes_what_runs_and_takes_nothing_new(spawn):
    QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": round(random.uniform(0.3, 1.5), 3)})
        for _ in range(60)
    )
    fleet = Fleet(spawn, HANDLER, 2, "--num-handlers", "4")
    stopping = fleet.procs[0]
    stopping_id = worker_id(stopping)
    wait_for(lambda: processing_by(stopping_id) == 4, 30, "the worker to be busy")
    signalled = time.time()
    stopping.signal(signal.SIGTERM)
    code, _ = wait_exit(stopping, 30)
    assert code == 0, stopping.output
    assert "SIGTERM received, draining" in stopping.output
    # In-flight jobs finished and were recorded; nothing was claimed after the signal
    # (a claim already on its way may still start within a moment).
    assert processing_by(stopping_id) == 0
    late = Event.objects.filter(kind="start", worker=stopping_id, at__gt=signalled + 0.5)
    assert not late.exists()
    mine = QueueJob.objects.filter(worker_hostname=stopping_id)
    assert set(mine.values_list("state", flat=True)) == {"completed"}
    # The other worker finishes the queue.
    wait_for(lambda: unfinished() == 0, 90, "the rest of the queue")
    fleet.procs.remove(stopping)
    assert set(fleet.stop()) == {0}, fleet.output()
    report = audit({})
    assert report.problems == []


@pytest.mark.timeout(120)
def test_second_sigterm_requeues_cooperative_jobs_and_leaves_the_rest_to_the_resetter(spawn):
    cooperative = QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": 60}) for _ in range(2)
    )
    stubborn = QueueJob.objects.bulk_create(
        QueueJob(behavior="block", payload={"seconds": 8, "first_only": True}) for _ in range(2)
    )
    resetter = spawn("runresetter", HANDLER, "--interval", "0.3")
    first = spawn("runworker", HANDLER, "--num-handlers", "4", "--no-resetter", env=worker_env())
    first_id = worker_id(first)
    wait_for(lambda: processing_by(first_id) == 4, 30, "all four jobs to start")
    first.signal(signal.SIGTERM)
    time.sleep(REPEAT_WINDOW + 0.3)  # sooner, it is taken for a copy of the first
    first.signal(signal.SIGTERM)
    code, died = wait_exit(first, 30)
    assert code == 1, first.output  # handlers that ignore cancellation were abandoned
    assert "did not stop; leaving them to the resetter" in first.output
    for job in cooperative:
        job.refresh_from_db()
        assert (job.state, job.num_resets, job.num_failures) == ("queued", 0, 0)
    # Let the requeued ones be quick the second time.
    QueueJob.objects.filter(pk__in=[j.pk for j in cooperative]).update(payload={"seconds": 0.01})
    second = spawn("runworker", HANDLER, "--num-handlers", "4", "--no-resetter", env=worker_env())
    wait_for(lambda: unfinished() == 0, 60, "every job to finish")
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0
    for job in stubborn:
        job.refresh_from_db()
        assert (job.state, job.num_resets) == ("completed", 1)
    report = audit(
        {int(first_id.split(":")[1]): died},
        resetter.output,
        requeued={job.pk for job in cooperative},
    )
    assert report.problems == []
