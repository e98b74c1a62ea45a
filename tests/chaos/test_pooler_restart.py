"""Workers through PgBouncer while it restarts and stalls, on a loaded machine (issue 42
item 16b: a run through PgBouncer in session mode, restarted under load, saw two
attempts of one job at once and 3 jobs running against ``max_concurrency`` 2).

A worker's connections through a pooler can hang rather than fail: after a restart a
new connection's first statement waits in PgBouncer's queue for a server connection.
A heartbeat waiting there neither lands nor fails, while a resetter elsewhere resets
the worker's jobs once their heartbeats are ``stalled_max_age`` old. The worker must
stop those attempts first (``runtime/silence.py``).

- The queue itself, made certain with PgBouncer's ``KILL db`` (connections cut, new
  ones held until ``RESUME``): the worker stops its attempt, the job runs again
  elsewhere, the two attempts never overlap. Both pooling modes.
- A fleet behind two poolers (one per host, as sidecars go), each worker with its own
  resetter, jobs of 0.05-6 s on a handler with ``max_concurrency = 2``: one pooler at
  a time restarts or stalls 3.5-5 s (mostly the pooler of a worker that just began a
  long job), busy processes load the CPUs. Nothing lost, no two attempts of a job at
  once, never more than 2 jobs at once. Before the fix it failed 3 runs in 3 (session
  mode): overlapping attempts 1-2, 3-4 jobs at once.

PostgreSQL only; skipped where ``pgbouncer`` is not installed. Sizes: CI the queue test
in both modes and the fleet in session mode, 3 workers, 20 jobs, a fault every
1.5-3 s, 2 busy processes (about 30 s each); full (DBWORKER_CHAOS_FULL=1) the fleet in
both modes, 6 workers, 300 jobs, a fault every 3-8 s, 6 busy processes.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.db import connection

from tests.conftest import database_now, server_url
from tests.conftest import test_database_url as database_url
from tests.pooler import PgBouncer, available, with_port
from tests.testapp.models import Event, QueueJob, TenantJob

from .conftest import (
    FULL,
    POSTGRES_ONLY,
    Fleet,
    audit,
    limit_audit,
    pid_of,
    say,
    scale,
    unfinished,
    wait_for,
    within,
    worker_id,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
    *POSTGRES_ONLY,
    pytest.mark.skipif(bool(available()), reason=available() or ""),
    pytest.mark.timeout(scale(150, 1200)),
]

HANDLER = "tests.testapp.handlers.PoolerChaosHandler"  # 2 at once across the fleet
PLAIN = "tests.testapp.handlers.ChaosHandler"  # heartbeat 0.25 s, stalled_max_age 3 s
MAX_CONCURRENCY = 2
JOBS = scale(20, 300)
#: Workers behind each of the two poolers.
WORKERS = scale((2, 1), (3, 3))
HANDLERS = 4
#: Seconds between faults, and how long a stalled pooler holds its clients.
FAULT_EVERY = scale((1.5, 3.0), (3.0, 8.0))
HOLD = (3.5, 5.0)
#: What the jobs sleep: mostly short, one in five past stalled_max_age (3 s).
DURATIONS = (0.05, 0.2, 0.5, 1.0, 6.0)
LONG = 6.0
BUSY = scale(2, 6)
POOL_SIZE = 20
#: At CI size the fleet test runs in session mode only (the mode of issue 42's run).
FULL_ONLY = pytest.mark.skipif(not FULL, reason="DBWORKER_CHAOS_FULL=1: the full size")


@contextlib.contextmanager
def cpu_load(processes, seconds):
    """``processes`` busy loops, each ended after ``seconds`` whatever happens."""
    loop = f"import time\nend = time.monotonic() + {seconds!r}\nwhile time.monotonic() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def started_by(job, worker):
    return Event.objects.filter(job_id=job.pk, kind="start", worker=worker).exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_a_worker_whose_connections_wait_in_the_poolers_queue_stops_its_jobs(spawn, mode):
    """What slipped in issue 42's run: after a pooler restart, a worker's new connections
    waited in PgBouncer's queue for a server connection (session mode gives each client
    one for good; a loaded machine makes the wait long). Its heartbeat statement neither
    came back nor failed, so the worker never gave up its jobs (it did so only when a
    heartbeat failed), while a resetter that had a connection reset them and another
    worker ran them: two attempts of one job at once, and one more job running than
    ``max_concurrency`` counts. Here the wait is PgBouncer's ``KILL db`` (every
    connection cut, new ones wait until ``RESUME``): the worker must stop the attempt
    by 2/3 of ``stalled_max_age`` after its last heartbeat, before the job is reset."""
    job = QueueJob.objects.create(behavior="sleep", payload={"seconds": 8})
    server = urlsplit(server_url())
    bouncer = PgBouncer(mode, server=f"{server.hostname}:{server.port or 5432}").start()
    name = connection.settings_dict["NAME"]
    try:
        pooled = {"DATABASE_URL": with_port(database_url(), bouncer.port)}
        first = spawn("runworker", PLAIN, "--no-resetter", "--num-handlers", "1", env=pooled)
        first_id = worker_id(first)
        wait_for(lambda: started_by(job, first_id), 30, "the job to start")
        bouncer.admin(f"KILL {name}")
        resetter = spawn("runresetter", PLAIN, "--interval", "0.3")
        second = spawn("runworker", PLAIN, "--no-resetter", "--num-handlers", "1")
        second_id = worker_id(second)
        wait_for(lambda: started_by(job, second_id), 30, "the job to run again")
        bouncer.admin(f"RESUME {name}")
        wait_for(lambda: unfinished() == 0, 60, "the job to finish")
        for proc in (first, second, resetter):
            proc.signal(signal.SIGTERM)
            assert proc.wait(30) == 0, proc.output
    finally:
        bouncer.stop()
    # The first worker was out of the database's reach: the resetter rightly took its
    # job (the audit would call that a reset of a live worker's job).
    cut_off = {int(first_id.split(":")[1]): time.time()}
    report = audit(cut_off, resetter.output + first.output + second.output)
    say(f"a worker waiting in the pooler's queue ({mode}): {report.summary()}")
    assert "no heartbeat for" in first.output, first.output
    assert report.problems == [], first.output
    assert (report.resets, report.overlaps) == (1, 0)


@pytest.mark.parametrize(
    "mode", ["session", scale(pytest.param("transaction", marks=FULL_ONLY), "transaction")]
)
def test_a_fleet_through_restarting_and_stalling_poolers_on_a_loaded_machine(spawn, mode):
    """Workers behind two PgBouncers (one per host, as sidecars go), each with its own
    resetter; one pooler at a time is restarted or stalls (its connections cut and new
    ones held in its queue for 1-5 s, as a pooler waiting for server connections holds
    them) while busy processes load the CPUs. The workers behind the other pooler reset
    the stalled ones' jobs once their heartbeats are stale and run them: the stalled
    workers must have stopped those attempts first. Jobs sleep 0.05-4 s (cooperative),
    so some outlast a stall."""
    rng = random.Random(42)
    TenantJob.objects.bulk_create(
        TenantJob(behavior="sleep", payload={"seconds": round(rng.choice(DURATIONS), 2)})
        for _ in range(JOBS)
    )
    server = urlsplit(server_url())
    address = f"{server.hostname}:{server.port or 5432}"
    bouncers = [PgBouncer(mode, server=address, pool_size=POOL_SIZE).start() for _ in range(2)]
    name = connection.settings_dict["NAME"]
    # The handlers record their attempts straight to the server (tests/settings.py).
    envs = [
        {
            "DATABASE_URL": with_port(database_url(), bouncer.port),
            "DBWORKER_TEST_POOLER": mode,
            "DBWORKER_TEST_EVENTS_URL": database_url(),
        }
        for bouncer in bouncers
    ]
    faults = Counter()
    started = time.monotonic()
    fleets = []
    try:
        with cpu_load(BUSY, scale(120, 1100)):
            # Each worker runs its own resetter (the default).
            fleets = [
                Fleet(spawn, HANDLER, count, "--num-handlers", str(HANDLERS), env=env)
                for count, env in zip(WORKERS, envs, strict=True)
            ]
            deadline = started + within(100, 1000)
            next_fault = time.monotonic() + rng.uniform(*FAULT_EVERY)
            while (left := unfinished(TenantJob)) > 0:
                if time.monotonic() > deadline:
                    output = "".join(f.output() for f in fleets)
                    pytest.fail(f"{left} jobs left unfinished:\n{output[-3000:]}")
                for fleet in fleets:
                    assert fleet.replace_dead() == 0, fleet.output()[-5000:]
                if time.monotonic() >= next_fault:
                    # Stall the pooler of a worker that began a long job a moment ago, if
                    # one did: its job outlasts the stall, and the other side resets and
                    # runs it. The first fault waits for one.
                    which = behind(fleets, long_running()) if rng.random() < 0.7 else None
                    if which is None and not faults["stalls"]:
                        time.sleep(0.1)
                        continue
                    if which is None:
                        which = rng.randrange(2)
                        say(f"restart pooler {which} ({mode}), {left} jobs left")
                        bouncers[which].restart(down=rng.uniform(0.1, 0.5))
                        faults["restarts"] += 1
                    else:
                        hold = rng.uniform(*HOLD)
                        say(f"pooler {which} ({mode}) holds its clients {hold:.1f}s, {left} left")
                        bouncers[which].admin(f"KILL {name}")
                        time.sleep(hold)
                        bouncers[which].admin(f"RESUME {name}")
                        faults["stalls"] += 1
                    next_fault = time.monotonic() + rng.uniform(*FAULT_EVERY)
                time.sleep(0.1)
            duration = time.monotonic() - started
        for fleet in fleets:
            assert set(fleet.stop()) == {0}, fleet.output()[-5000:]
    finally:
        for bouncer in bouncers:
            bouncer.stop()
    output = "".join(fleet.output() for fleet in fleets)
    report = audit({}, output, model=TenantJob)
    overall, _, _ = limit_audit({})
    # A worker whose pooler held it past stalled_max_age was rightly reset while alive.
    problems = [p for p in report.problems if not p.endswith(", which was alive")]
    said = output.count("no heartbeat for")
    say(
        f"{sum(WORKERS)} workers behind 2 PgBouncers ({mode} mode), {BUSY} busy processes: "
        f"{faults['restarts']} restarts, {faults['stalls']} stalls, {said} times a worker "
        f"stopped its jobs for want of heartbeats, {report.summary()}, peak overlap "
        f"{overall} (limit {MAX_CONCURRENCY}), {JOBS / duration:.1f} jobs/s in "
        f"{duration:.0f}s; {problems}"
    )
    assert problems == [], output[-8000:]
    assert (report.lost, report.overlaps) == (0, 0)
    assert overall <= MAX_CONCURRENCY
    assert faults["stalls"] >= 1
    assert faults["restarts"] + faults["stalls"] >= scale(2, 20)


def long_running():
    """Worker ids that began a long job within the last 1.5 s."""
    recent = database_now() - timedelta(seconds=1.5)
    rows = TenantJob.objects.filter(state="processing", started_at__gte=recent)
    return {w for w, p in rows.values_list("worker_hostname", "payload") if p["seconds"] == LONG}


def behind(fleets, workers):
    """The index of the pooler in front of one of ``workers`` (None: none of them)."""
    pids = {pid_of(worker) for worker in workers}
    for index, fleet in enumerate(fleets):
        if any(proc.proc.pid in pids for proc in fleet.alive()):
            return index
    return None
