"""The database goes away: every connection terminated (PostgreSQL, MariaDB), or
refused for a while (what clients see while PostgreSQL restarts). Only the test
database is touched."""

import random
import signal
import time

import pytest

from tests.testapp.models import QueueJob

from .conftest import (
    ON_POSTGRES,
    REQUEUE_LINE,
    ROW_LOCKS_ONLY,
    Fleet,
    audit,
    counts,
    outage,
    say,
    scale,
    terminate_backends,
    unfinished,
    wait_for,
    within,
)

pytestmark = [pytest.mark.chaos, *ROW_LOCKS_ONLY, pytest.mark.django_db(transaction=True)]

HANDLER = "tests.testapp.handlers.ChaosHandler"  # stalled_max_age 3 s
#: The same scenario with the handler as a coroutine on the worker's event loop.
HANDLERS_BY_KIND = {"threads": HANDLER, "async": "tests.testapp.handlers.AsyncChaosHandler"}


@pytest.mark.timeout(scale(180, 1800))
@pytest.mark.parametrize("kind", HANDLERS_BY_KIND)
def test_connections_terminated_again_and_again(spawn, kind):
    handler = HANDLERS_BY_KIND[kind]
    jobs = scale(600, 10_000)
    QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": round(random.uniform(0.01, 0.2), 3)})
        for _ in range(jobs)
    )
    started = time.monotonic()
    resetter = spawn("runresetter", handler, "--interval", "0.5")
    # These workers run their own resetter too: both kinds must ride it out.
    fleet = Fleet(spawn, handler, scale(3, 4), "--num-handlers", str(scale(4, 8)))
    terminations = 0
    terminated = 0
    deadline = started + within(150, 1700)
    next_cut = time.monotonic() + 1.5
    while unfinished() > 0:
        assert time.monotonic() < deadline, f"jobs left unfinished: {counts()}"
        if time.monotonic() >= next_cut:
            terminated += terminate_backends()
            terminations += 1
            next_cut = time.monotonic() + random.uniform(0.5, 2.0)
        time.sleep(0.1)
    duration = time.monotonic() - started
    assert fleet.replace_dead() == 0, fleet.output()
    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0, resetter.output

    output = fleet.output() + resetter.output
    report = audit({}, output + resetter.output)
    say(
        f"connections terminated ({kind}): {terminations} rounds ({terminated} connections), "
        f"{report.summary()}, {duration:.0f}s; {report.problems}"
    )
    assert terminations >= 3
    assert report.problems == []
    assert "database unreachable" in output


@pytest.mark.timeout(scale(180, 600))
@pytest.mark.postgres
@pytest.mark.skipif(not ON_POSTGRES, reason="ALLOW_CONNECTIONS: PostgreSQL only")
def test_outage_longer_than_stalled_max_age_resets_no_live_job(spawn):
    """After the database comes back, live workers heartbeat before any resetter may
    take their jobs: the resetters saw the outage too and give them stalled_max_age."""
    jobs = scale(80, 2000)
    QueueJob.objects.bulk_create(
        QueueJob(behavior="sleep", payload={"seconds": round(random.uniform(0.5, 2.0), 3)})
        for _ in range(jobs)
    )
    resetter = spawn("runresetter", HANDLER, "--interval", "0.5")
    fleet = Fleet(spawn, HANDLER, 3, "--num-handlers", "4")
    wait_for(lambda: QueueJob.objects.filter(state="completed").count() >= 12, 60, "first jobs")
    outages = scale(1, 3)
    for n in range(outages):
        wait_for(lambda: QueueJob.objects.filter(state="processing").count() >= 6, 30, "busy")
        with outage():
            say(f"outage {n + 1}: the test database refuses connections for 7 s")
            time.sleep(7)  # well past stalled_max_age (3 s)
        time.sleep(3)
    wait_for(lambda: unfinished() == 0, scale(150, 500), "every job to finish")
    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0, resetter.output

    output = fleet.output() + resetter.output
    report = audit({}, output)
    requeues = len(REQUEUE_LINE.findall(output))
    say(f"outages: {outages} x 7 s, {report.summary()}, {requeues} requeued; {report.problems}")
    assert report.problems == []
    assert report.resets == 0
    assert "resetter pass failed" in resetter.output
