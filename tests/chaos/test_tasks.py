"""kill -9 of random workers running ``django.tasks`` tasks, plain and ``async def`` ones
(threads and the event loop of each worker): the engine's guarantees hold for tasks as
for any handler."""

import random
import signal
import time

import pytest

from django_dbworker.tasks.models import TaskJob
from tests.testapp.tasks import async_chaos_nap, chaos_nap

from .conftest import ROW_LOCKS_ONLY, Fleet, audit, kill_until_done, say, scale, within, worker_env

pytestmark = [
    pytest.mark.chaos,
    *ROW_LOCKS_ONLY,
    pytest.mark.django_db(transaction=True),
]

TASKS = scale(1_200, 10_000)
WORKERS = scale(3, 4)
KILL_EVERY = scale((1.0, 2.5), (2.0, 5.0))
KILLS = scale(3, 10)  # at least, whatever the pace


def left():
    return TaskJob.objects.exclude(state__in=("completed", "failed", "canceled")).count()


@pytest.mark.timeout(scale(240, 3600))
def test_kill_9_loop_with_tasks_loses_none_and_never_runs_one_twice_at_once(spawn):
    for i in range(TASKS):
        (async_chaos_nap if i % 2 else chaos_nap).enqueue(round(random.uniform(0.05, 0.3), 3))
    started = time.monotonic()
    env = {**worker_env(), "DBWORKER_TEST_TASK_RESETS": "1000"}  # tests/settings.py
    resetter = spawn("runresetter", "--tasks", "--interval", "0.5", env=env)
    fleet = Fleet(spawn, "--tasks", WORKERS, "--no-resetter", "--num-handlers", "4", env=env)
    kill_until_done(
        fleet,
        left,
        started + within(180, 3300),
        KILL_EVERY,
        spare=4 * WORKERS,
        model=TaskJob,
        at_least=KILLS,
    )
    duration = time.monotonic() - started
    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0, resetter.output

    report = audit(fleet.died_at, resetter.output, model=TaskJob, kinds=("task-start", "task-end"))
    say(
        f"kill -9 loop with tasks: {WORKERS} workers x 4 threads, {fleet.kills} kills, "
        f"{report.summary()}, {duration:.0f}s; {report.problems}"
    )
    assert report.problems == []
    assert (report.jobs, report.lost, report.overlaps) == (TASKS, 0, 0)
    assert fleet.kills >= KILLS
    assert report.resets >= 1  # the kills did hit running tasks
    for nap in (chaos_nap, async_chaos_nap):
        ids = TaskJob.objects.filter(task_path=nap.module_path).values_list("result_id", flat=True)
        assert len(ids) == TASKS // 2
        assert {nap.get_result(id_.hex).status.name for id_ in ids} == {"SUCCESSFUL"}
