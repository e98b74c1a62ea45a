"""A worker paused past stalled_max_age (SIGSTOP: a GC pause, a frozen VM) wakes up
after its job was reset and taken by another worker."""

import signal

import pytest

from tests.testapp.models import Event, QueueJob

from .conftest import ROW_LOCKS_ONLY, wait_for, worker_id

pytestmark = [
    pytest.mark.chaos,
    *ROW_LOCKS_ONLY,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.ChaosHandler"  # heartbeat 0.25 s, stalled_max_age 3 s


def recorded(job, kind, worker):
    return Event.objects.filter(job_id=job.pk, kind=kind, worker=worker).exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("first", "log"),
    [("complete", False), ("fail", True)],
    ids=["late-completion", "late-failure-and-log"],
)
def test_a_paused_worker_cannot_overwrite_the_newer_attempt(spawn, first, log):
    """The late attempt ends as ``first`` says, the newer one the other way: the newer
    outcome stands, and the late worker's outcome (and log entry) is refused."""
    job = QueueJob.objects.create(
        behavior="fence", payload={"seconds": 4, "first": first, "log": log}
    )
    resetter = spawn("runresetter", HANDLER, "--interval", "0.3")
    late = spawn("runworker", HANDLER, "--num-handlers", "1", "--no-resetter")
    late_id = worker_id(late)
    wait_for(lambda: recorded(job, "start", late_id), 30, "the first attempt")
    late.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: QueueJob.objects.get(pk=job.pk).num_resets == 1, 20, "the reset")
        newer = spawn("runworker", HANDLER, "--num-handlers", "1", "--no-resetter")
        newer_id = worker_id(newer)
        wait_for(lambda: QueueJob.objects.get(pk=job.pk).state in ("completed", "failed"), 30, "")
    finally:
        late.signal(signal.SIGCONT)
    # The paused attempt's sleep is long over: it ends now and tries to write.
    wait_for(lambda: recorded(job, "end", late_id), 20, "the late attempt to end")
    wait_for(
        lambda: "refused" in late.output or "no longer ours" in late.output,
        10,
        "the late worker to find its outcome refused",
    )
    for proc in (late, newer, resetter):
        proc.signal(signal.SIGTERM)
    assert late.wait(30) == 0, late.output
    assert newer.wait(30) == 0, newer.output
    assert resetter.wait(30) == 0

    job.refresh_from_db()
    assert job.worker_hostname == newer_id
    assert job.num_resets == 1
    if first == "complete":  # the newer attempt failed: the late completion must not win
        assert (job.state, job.num_failures) == ("failed", 1)
        assert job.failure_message.startswith("NonRetryableError: fence: failing attempt")
    else:  # the newer attempt completed: the late failure must not count
        assert (job.state, job.num_failures, job.failure_message) == ("completed", 0, None)
    if log:
        assert [entry["key"] for entry in job.execution_logs] == ["later"]
        assert newer_id in job.execution_logs[0]["out"]
