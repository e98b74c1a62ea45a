"""A one-second schedule on a fleet of workers while one of them is killed with -9 every
few seconds: exactly one job per tick, none missed, none doubled (issue 12)."""

import datetime
import itertools
import random
import time

import pytest

from django_dbworker.control.models import ScheduleTick
from tests.testapp.models import QueueJob

from .conftest import Fleet, say, scale, wait_for, worker_id

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

HANDLER = "tests.testapp.handlers.ScheduledHandler"
WORKERS = 4
RUN_FOR = scale(20, 60)
KILL_EVERY = scale(4.0, 10.0)


@pytest.mark.timeout(RUN_FOR + 120)
def test_a_one_second_schedule_enqueues_each_tick_once_through_kill_9(spawn):
    fleet = Fleet(spawn, HANDLER, WORKERS)
    # The run counts from the first tick: on a loaded host (CI, coverage) the workers
    # took seconds to start, and those seconds had no tick to miss.
    wait_for(ScheduleTick.objects.exists, 60, "the first tick")
    started = time.monotonic()
    next_kill = started + KILL_EVERY
    while time.monotonic() - started < RUN_FOR:
        assert fleet.replace_dead() == 0, "a worker died without being killed:\n" + fleet.output()
        if time.monotonic() >= next_kill:
            victim = fleet.kill_random()
            say(f"kill -9 {victim.proc.pid} ({fleet.kills} kills)")
            next_kill = time.monotonic() + KILL_EVERY * random.uniform(0.8, 1.2)
        time.sleep(0.1)
    for proc in fleet.alive():  # a worker restarted a moment ago handles SIGTERM once up
        worker_id(proc)
    assert set(fleet.stop()) == {0}, fleet.output()

    ticks = list(ScheduleTick.objects.order_by("tick").values_list("tick", "enqueued_at", "job"))
    seconds = [tick for tick, _, _ in ticks]
    gaps = [
        (a, b) for a, b in itertools.pairwise(seconds) if b - a != datetime.timedelta(1 / 86400)
    ]
    late = max((made - tick).total_seconds() for tick, made, _ in ticks)
    jobs = set(QueueJob.objects.filter(behavior="tick").values_list("pk", flat=True))
    say(
        f"schedule through kill -9: {WORKERS} workers, {fleet.kills} kills, {len(ticks)} ticks "
        f"in {RUN_FOR}s, gaps {len(gaps)}, jobs {len(jobs)}, latest enqueue {late:.3f}s after "
        "its tick"
    )
    assert gaps == []
    assert len(ticks) >= RUN_FOR - 5
    assert {label for _, _, label in ticks} == {f"testapp.QueueJob:{pk}" for pk in jobs}
    assert len(jobs) == len(ticks)  # one job per tick, no job without its tick's record
    assert fleet.kills >= RUN_FOR // KILL_EVERY - 1
