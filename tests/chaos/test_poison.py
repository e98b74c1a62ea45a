"""A poison job: its handler kills the worker process every time it runs."""

import random
import signal
import time

import pytest

from tests.testapp.models import QueueJob

from .conftest import ROW_LOCKS_ONLY, Fleet, audit, counts, say, scale, unfinished, within

pytestmark = [
    pytest.mark.chaos,
    *ROW_LOCKS_ONLY,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.PoisonHandler"  # max_num_resets = 3
JOBS = scale(400, 5000)
WORKERS = scale(3, 4)
HANDLERS = scale(4, 8)


@pytest.mark.timeout(scale(180, 1200))
def test_poison_job_fails_after_max_num_resets_and_takes_no_other_job_with_it(spawn):
    jobs = [
        QueueJob(behavior="sleep", payload={"seconds": round(random.uniform(0.05, 0.3), 3)})
        for _ in range(JOBS)
    ]
    jobs[JOBS // 10] = QueueJob(behavior="crash")
    QueueJob.objects.bulk_create(jobs)
    poison = QueueJob.objects.get(behavior="crash")
    started = time.monotonic()
    resetter = spawn("runresetter", HANDLER, "--interval", "0.5")
    fleet = Fleet(spawn, HANDLER, WORKERS, "--no-resetter", "--num-handlers", str(HANDLERS))
    deadline = time.monotonic() + within(150, 1100)
    while unfinished() > 0:
        assert time.monotonic() < deadline, f"jobs left unfinished: {counts()}"
        if fleet.replace_dead():
            say(f"a worker died ({fleet.restarts} so far); poison: {poison_state(poison)}")
        time.sleep(0.1)
    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0

    poison.refresh_from_db()
    assert (poison.state, poison.num_resets) == ("failed", 3)
    assert poison.failure_message == "job processor died while handling this job too many times"
    assert fleet.restarts == 4  # it ran 1 + 3 times, each time killing its worker
    others = QueueJob.objects.exclude(pk=poison.pk)
    assert counts() == {"completed": JOBS - 1, "failed": 1}, {
        job.pk: (job.state, job.num_resets) for job in others.exclude(state="completed")
    }
    report = audit(fleet.died_at, resetter.output, final_states=("completed", "failed"))
    say(
        f"poison job: {time.monotonic() - started:.0f}s, {fleet.restarts} crashes, "
        f"{report.summary()}; {report.problems}"
    )
    assert report.problems == []
    # Jobs that shared a process with the poison job were reset with it, but none of them
    # more than once: after its first crash the poison job never shares a worker with a
    # job that was reset.
    assert others.filter(num_resets__gt=1).count() == 0


def poison_state(job):
    job.refresh_from_db()
    return f"{job.state}, {job.num_resets} resets"
