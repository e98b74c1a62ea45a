"""kill -9 of random workers, over and over, while the resetter runs."""

import random
import signal
import time

import pytest

from tests.testapp.models import QueueJob

from .conftest import ROW_LOCKS_ONLY, Fleet, audit, kill_until_done, say, scale, unfinished, within

pytestmark = [
    pytest.mark.chaos,
    *ROW_LOCKS_ONLY,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.ChaosHandler"
ASYNC = "tests.testapp.handlers.AsyncChaosHandler"
#: The same scenario with the handler as a coroutine on the worker's event loop, and with
#: both on one shared pool (``--pool``), sharing the table.
HANDLERS_BY_KIND = {"threads": [HANDLER], "async": [ASYNC], "pool": [HANDLER, ASYNC]}
JOBS = scale(900, 20_000)
WORKERS = scale(3, 4)
HANDLERS = scale(4, 8)
KILL_EVERY = scale((1.0, 2.5), (2.0, 5.0))  # seconds, uniformly drawn
KILLS = scale(3, 10)  # at least, whatever the pace


@pytest.mark.timeout(scale(240, 3600))
@pytest.mark.parametrize("kind", HANDLERS_BY_KIND)
def test_kill_9_loop_loses_nothing_and_never_runs_a_job_twice_at_once(spawn, kind):
    handlers = HANDLERS_BY_KIND[kind]
    QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": round(random.uniform(0.01, 0.15), 3)})
        for _ in range(JOBS)
    )
    started = time.monotonic()
    resetter = spawn("runresetter", *handlers, "--interval", "0.5")
    slots = ["--pool", str(HANDLERS)] if kind == "pool" else ["--num-handlers", str(HANDLERS)]
    fleet = Fleet(spawn, handlers, WORKERS, "--no-resetter", *slots)
    kill_until_done(
        fleet,
        unfinished,
        started + within(180, 3300),
        KILL_EVERY,
        spare=HANDLERS * WORKERS,
        at_least=KILLS,
    )
    duration = time.monotonic() - started
    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0, resetter.output

    report = audit(fleet.died_at, resetter.output)
    say(
        f"kill -9 loop ({kind}): {WORKERS} workers x {HANDLERS} handlers, {fleet.kills} kills, "
        f"{fleet.restarts} restarts, {report.summary()}, {duration:.0f}s; {report.problems}"
    )
    assert report.problems == []
    assert report.jobs == JOBS
    assert fleet.kills >= KILLS
    assert report.resets >= 1  # the kills did hit running jobs
