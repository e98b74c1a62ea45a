"""Two PostgreSQL servers under one ``runworker`` (docs/operations.md § Several databases),
and one of them crashes: QueueJob (and a cron schedule) on ``default``; TenantJob, with
fleet-wide limits, and the tasks backend's jobs on the suite's own second server
(tests/clusters.py, tests/routers.py). The second server is stopped as a crash stops it
(``pg_ctl stop -m immediate``: every backend killed, no checkpoint) while jobs of both
run. The same worker process goes on claiming and completing the jobs of ``default``
(and enqueueing its ticks); when the server is back its jobs resume. Nothing is lost,
no job runs twice at once, and every extra attempt is a logged requeue or reset."""

import random
import signal
import time

import pytest
from django.db import connections

from django_dbworker.control.models import ScheduleTick
from tests.testapp.models import QueueJob, TenantJob

from .conftest import audit, say, wait_for, worker_env

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "second"]),
    pytest.mark.xdist_group("second_cluster"),
]

HANDLERS = [
    "tests.testapp.handlers.TickingChaosHandler",  # QueueJob on default; stalled_max_age 3 s
    "tests.testapp.handlers.TenantChaosHandler",  # TenantJob on second
]
#: Seconds the second server stays down: past the heartbeat's give-up (2/3 of 3 s) and
#: the stalled_max_age of its jobs.
OUTAGE = 6.0


def sleeping(model, count, **fields):
    model.objects.bulk_create(
        model(behavior="sleep", payload={"seconds": round(random.uniform(0.01, 0.05), 3)}, **fields)
        for _ in range(count)
    )


def done(model):
    return model.objects.filter(state="completed").count()


@pytest.mark.timeout(150)
def test_one_server_crashes_and_the_other_keeps_working(spawn, second_cluster, second_database):
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp.tasks import add

    sleeping(QueueJob, 200)
    for tenant in range(20):
        sleeping(TenantJob, 15, tenant=tenant)
    sums = [add.enqueue(i, i) for i in range(40)]
    env = {**worker_env(), "DBWORKER_TEST_SECOND_URL": second_database}
    worker = spawn("runworker", *HANDLERS, "--tasks", "-v", "2", env=env)
    wait_for(lambda: done(TenantJob) >= 20, 60, "second's jobs to start completing")

    second_cluster.crash()  # jobs of both are running
    crashed = time.monotonic()
    ticks = ScheduleTick.objects.count()
    before = done(QueueJob)
    sleeping(QueueJob, 100)  # enqueued during the outage: the same worker runs them
    wait_for(lambda: done(QueueJob) >= before + 100, 30, "default's jobs during the outage")
    during = done(QueueJob) - before
    took = time.monotonic() - crashed
    time.sleep(max(0.0, OUTAGE - took))
    assert worker.proc.poll() is None, worker.output
    assert ScheduleTick.objects.count() > ticks, "default's schedule stopped ticking"
    say(f"second down {time.monotonic() - crashed:.1f}s: {during} jobs of default done")

    second_cluster.start()
    connections["second"].close()  # this test's own, cut by the crash
    back = time.monotonic()
    wait_for(
        lambda: done(TenantJob) == 300 and TaskJob.objects.filter(state="completed").count() == 40,
        60,
        "second's jobs after its restart",
    )
    say(f"second's jobs all done {time.monotonic() - back:.1f}s after its restart")
    # A claim the crash cut after its commit: the lane gives its rows back at its first
    # claim once the server answers again, before the resetter may spend a reset on them.
    wait_for(lambda: QueueJob.objects.exclude(state="completed").count() == 0, 30, "ticks")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output

    output = worker.output
    say(f"requeued unrun (a claim's reply lost): {output.count('requeued unrun')}")
    assert "database 'second' unreachable" in output
    assert "database 'second' reachable again" in output
    for result in sums:
        result.refresh()
        assert result.status == "SUCCESSFUL"
    assert sorted(r.return_value for r in sums) == [2 * i for i in range(40)]
    for model, kinds in ((QueueJob, ("start", "end")), (TenantJob, ("tenant-start", "tenant-end"))):
        report = audit({}, output, model=model, kinds=kinds)
        say(f"{model._meta.label}: {report.summary()}")
        assert report.problems == [], report.problems
