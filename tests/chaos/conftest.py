"""Fault injection: real runworker/runresetter processes, real faults, bounded waits.

Sizes are small by default (what CI runs). ``DBWORKER_CHAOS_FULL=1`` runs the full
counts of docs/reliability.md, e.g.::

    DBWORKER_CHAOS_FULL=1 DATABASE_URL=postgres://postgres@127.0.0.1:5432/dbworker \\
        .venv/bin/python -m pytest tests/chaos -m chaos -v -s
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest
from django.db import connection

from tests.conftest import test_database_url
from tests.pace import scaled
from tests.testapp.models import Event, QueueJob

FULL = os.environ.get("DBWORKER_CHAOS_FULL", "") not in ("", "0")
ON_POSTGRES = connection.vendor == "postgresql"

#: Marks for tests that need PostgreSQL (pg_terminate_backend, row locks).
POSTGRES_ONLY = [
    pytest.mark.postgres,
    pytest.mark.skipif(not ON_POSTGRES, reason="needs PostgreSQL: set DATABASE_URL"),
]

#: Marks for tests that need row locks and nothing else of PostgreSQL's (the kill -9
#: loop): PostgreSQL and MariaDB.
ROW_LOCKS_ONLY = [
    pytest.mark.skipif(
        connection.vendor not in ("postgresql", "mysql"),
        reason="needs PostgreSQL or MariaDB: set DATABASE_URL",
    ),
]

FINAL = {"completed", "failed", "canceled"}
RESET_LINE = re.compile(r"job ([\w.]+):(\d+) reset: no heartbeat for over \S+ from worker (\S+)")
#: A worker gave a job back, nothing counted: "job L:7: requeued unrun: …" (shutdown),
#: "job L:7: requeued: the worker could not heartbeat its jobs".
REQUEUE_LINE = re.compile(r"job ([\w.]+):(\d+): requeued")
FAIL_LINE = re.compile(r"job testapp\.QueueJob:(\d+) failed: stalled again after \d+ resets")
STARTED_LINE = re.compile(r"worker (\S+) started: ")


def scale(small, full):
    """The CI size, or the full size under DBWORKER_CHAOS_FULL=1."""
    return full if FULL else small


def within(small, full):
    """A deadline of a quiet machine (``scale``), scaled to this one (``tests.pace``)."""
    return scaled(scale(small, full))


def say(message):
    """Progress for long runs (visible with -s)."""
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def worker_env():
    """Subprocess settings: keep handler connections between jobs (CONN_MAX_AGE)."""
    url = test_database_url()
    if url.startswith("postgres"):
        url += "?conn_max_age=60"
    return {"DATABASE_URL": url}


def pid_of(worker_id):
    return int(worker_id.split(":")[1])


def counts(model=QueueJob):
    return Counter(model.objects.values_list("state", flat=True))


def unfinished(model=QueueJob):
    return model.objects.exclude(state__in=FINAL).count()


def tenant_jobs(count, keys, rng=random):
    """``count`` TenantJobs of ``keys`` tenants that sleep 5-50 ms each (the limits'
    chaos tests)."""
    from tests.testapp.models import TenantJob

    TenantJob.objects.bulk_create(
        TenantJob(
            tenant=rng.randrange(keys),
            behavior="sleep",
            payload={"seconds": round(rng.uniform(0.005, 0.05), 3)},
        )
        for _ in range(count)
    )


def kill_until_done(fleet, left, deadline, kill_every, spare, model=QueueJob, at_least=0):
    """Kill a random worker of ``fleet`` every ``kill_every`` (min, max) seconds until
    ``left()`` is 0, sparing the last ``spare`` jobs; fail past ``deadline`` (monotonic)
    or when a worker died unkilled. At least ``at_least`` kills whatever the pace: one
    more is due at each of that many points spread over the jobs, when the clock has
    not made it yet (a quick drain would otherwise outrun ``kill_every``)."""
    first = left()
    step = (first - spare) / (at_least + 1)
    marks = [first - step * (i + 1) for i in range(at_least)]
    next_kill = time.monotonic() + random.uniform(*kill_every)
    while (remaining := left()) > 0:
        if time.monotonic() >= deadline:
            states = Counter(model.objects.values_list("state", flat=True))
            pytest.fail(f"jobs left unfinished: {dict(states)}")
        assert fleet.replace_dead() == 0, "a worker died without being killed:\n" + fleet.output()
        due = sum(remaining <= mark for mark in marks) > fleet.kills
        if (due or time.monotonic() >= next_kill) and remaining > spare:
            victim = fleet.kill_random()
            say(f"kill -9 {victim.proc.pid} ({fleet.kills} kills), {remaining} jobs left")
            next_kill = time.monotonic() + random.uniform(*kill_every)
        time.sleep(0.1)


def wait_for(predicate, timeout, message, interval=0.2):
    """Poll until ``predicate()`` is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {message}; states: {counts()}")
        time.sleep(interval)
    return value


# -- PostgreSQL faults -------------------------------------------------------------------


def terminate_backends():
    """Terminate every other connection to the test database (never the server, never
    other databases): ``pg_terminate_backend`` on PostgreSQL, ``KILL CONNECTION`` on
    MariaDB. Returns how many were terminated."""
    with connection.cursor() as cursor:
        if connection.vendor != "mysql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]
        cursor.execute(
            "SELECT ID FROM information_schema.PROCESSLIST "
            "WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
        )
        killed = 0
        for (session,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL CONNECTION {int(session)}")
                killed += 1
            except Exception as exc:  # gone meanwhile: 1094, unknown thread id
                if getattr(exc, "args", (None,))[0] != 1094:
                    raise
        return killed


@contextlib.contextmanager
def outage():
    """The test database refuses new connections and every open one is cut (but the test's
    own): what clients see while PostgreSQL restarts, without touching the shared server.
    Run from the ``postgres`` maintenance database, as a database cannot refuse itself."""
    import psycopg

    settings = connection.settings_dict
    name = settings["NAME"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        mine = cursor.fetchone()[0]
    admin = psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
        connect_timeout=10,
    )
    quoted = connection.ops.quote_name(name)
    try:
        admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> %s",
                [name, mine],
            )
            yield
        finally:
            admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")
    finally:
        admin.close()


@contextlib.contextmanager
def row_locks(ids, mode="FOR UPDATE"):
    """Hold row locks on jobs ``ids`` in an open transaction of another connection
    (``FOR KEY SHARE`` is what inserting a row with a foreign key to a job takes on
    PostgreSQL)."""
    settings = connection.settings_dict
    table = connection.ops.quote_name(QueueJob._meta.db_table)
    marks = ", ".join(["%s"] * len(ids))
    if connection.vendor == "mysql":
        import MySQLdb

        holder = MySQLdb.connect(
            host=settings["HOST"] or "127.0.0.1",
            port=int(settings["PORT"] or 3306),
            user=settings["USER"],
            password=settings["PASSWORD"] or "",
            database=settings["NAME"],
            connect_timeout=10,
        )
    else:
        import psycopg

        holder = psycopg.connect(
            host=settings["HOST"] or "127.0.0.1",
            port=settings["PORT"] or 5432,
            user=settings["USER"] or None,
            password=settings["PASSWORD"] or None,
            dbname=settings["NAME"],
            connect_timeout=10,
        )
    try:
        cursor = holder.cursor()
        if connection.vendor == "mysql":  # as a Django connection runs (no gap locks)
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cursor.execute(f"SELECT id FROM {table} WHERE id IN ({marks}) {mode}", list(ids))
        assert len(cursor.fetchall()) == len(ids)
        yield
    finally:
        holder.rollback()
        holder.close()


# -- worker processes --------------------------------------------------------------------


class Fleet:
    """runworker processes the test kills and restarts. Remembers when each died."""

    def __init__(self, spawn, handler, size, *args, env=None):
        self.spawn = spawn
        #: The workers' environment (default ``worker_env()``).
        self.env = env or worker_env()
        #: One dotted path, or several (each process runs them all).
        self.handlers = [handler] if isinstance(handler, str) else list(handler)
        self.args = args
        self.procs = []
        self.everyone = []
        #: pid -> time.time() once the process is known dead (after waitpid).
        self.died_at = {}
        self.kills = 0
        self.restarts = 0
        for _ in range(size):
            self._start()

    def _start(self):
        proc = self.spawn("runworker", *self.handlers, *self.args, env=self.env)
        self.procs.append(proc)
        self.everyone.append(proc)
        return proc

    def alive(self):
        return [p for p in self.procs if p.proc.poll() is None]

    def kill_random(self):
        alive = self.alive()
        if not alive:
            return None
        victim = random.choice(alive)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        self.died_at[victim.proc.pid] = time.time()
        self.procs.remove(victim)
        self.kills += 1
        self._start()
        self.restarts += 1
        return victim

    def replace_dead(self):
        """Restart workers that died on their own (a poison job); returns how many."""
        dead = [p for p in self.procs if p.proc.poll() is not None]
        for proc in dead:
            self.died_at[proc.proc.pid] = time.time()
            self.procs.remove(proc)
            self._start()
            self.restarts += 1
        return len(dead)

    def wait_started(self, timeout=60):
        """Wait until every live worker has started (logged its id): one restarted a
        moment ago on a loaded machine may take seconds to import and connect."""
        for proc in self.alive():
            wait_for(
                lambda p=proc: p.proc.poll() is not None or STARTED_LINE.search(p.output),
                timeout,
                "the worker to start",
            )

    def stop(self, timeout=60):
        """SIGTERM every live worker once it has started (a worker restarted a moment
        ago has not installed its signal handlers yet: SIGTERM would kill it, -15);
        returns their exit codes."""
        for proc in self.alive():
            wait_for(
                lambda p=proc: p.proc.poll() is not None or STARTED_LINE.search(p.output),
                30,
                "the worker to start",
            )
            proc.signal(signal.SIGTERM)
        return [proc.wait(timeout) for proc in self.procs]

    def output(self):
        return "\n".join(proc.output for proc in self.everyone)


def worker_id(proc, timeout=30):
    """The worker id a runworker process logged at start."""
    match = wait_for(lambda: STARTED_LINE.search(proc.output), timeout, "the worker to start")
    return match.group(1)


def wait_exit(proc, timeout):
    """Wait for a process to exit; return (exit code, time.time() once it was reaped)."""
    code = proc.wait(timeout)
    return code, time.time()


# -- what the handlers recorded ----------------------------------------------------------


@dataclass
class Attempt:
    job_id: int
    token: str
    worker: str
    start: float | None = None
    end: float | None = None


def recorded_attempts(start="start", end="end"):
    """Attempts from the handler's start/end events (a retried event write may duplicate
    one: the first time counts)."""
    attempts = {}
    events = Event.objects.filter(kind__in=(start, end)).order_by("id")
    for job_id, kind, token, worker, at in events.values_list(
        "job_id", "kind", "token", "worker", "at"
    ).iterator():
        attempt = attempts.setdefault(token, Attempt(job_id, token, worker))
        if kind == start and attempt.start is None:
            attempt.start = at
        elif kind == end and attempt.end is None:
            attempt.end = at
    return list(attempts.values())


@dataclass
class Audit:
    jobs: int = 0
    attempts: int = 0
    killed_attempts: int = 0
    resets: int = 0
    failures: int = 0
    #: Jobs not in a final state, or recorded but gone from the table.
    lost: int = 0
    #: Pairs of attempts of one job that overlapped in time.
    overlaps: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self):
        return (
            f"{self.jobs} jobs, {self.attempts} attempts ({self.killed_attempts} cut by a kill), "
            f"{self.resets} resets, {self.failures} failures, lost {self.lost}, "
            f"overlapping attempts {self.overlaps}"
        )

    def problem(self, text):
        if len(self.problems) < 30:
            self.problems.append(text)


def audit(
    died_at,
    resetter_output=None,
    final_states=("completed",),
    requeued=(),
    model=QueueJob,
    key=lambda pk: pk,
    kinds=("start", "end"),
):
    """Check the invariants of a run against the database and the handler's records.

    - every job is in one of ``final_states``;
    - no two attempts of one job overlapped in time (an attempt without an end ended
      when its worker process was killed, which must have happened);
    - every extra attempt is explained by a reset, a recorded failure, or a requeue
      (``requeued``: job ids the test saw requeued once; or the requeue lines of the
      workers' output, when it is passed with the resetter's);
    - attempts cut by a kill are no more than the job's resets (plus the last one of a
      job failed by the resetter);
    - with the resetter's log: its reset lines per job equal ``num_resets``, and it only
      ever reset jobs of workers that were dead.

    ``model`` is the job table; ``key`` maps its keys to the ``job_id`` the handler
    recorded (UUID keys do not fit the event table's integer column) with ``kinds``.
    """
    report = Audit()
    # Requeues the workers logged (the caller passes their output with the resetter's).
    requeues = Counter(
        int(m.group(2))
        for m in REQUEUE_LINE.finditer(resetter_output or "")
        if m.group(1) == model._meta.label
    )
    jobs = {
        key(pk): (state, resets, failures)
        for pk, state, resets, failures in model.objects.values_list(
            "pk", "state", "num_resets", "num_failures"
        )
    }
    report.jobs = len(jobs)
    for pk, (state, _, _) in jobs.items():
        if state not in final_states:
            report.lost += 1
            report.problem(f"job {pk} ended {state}")
    by_job = defaultdict(list)
    for attempt in recorded_attempts(*kinds):
        report.attempts += 1
        if attempt.start is None:
            report.problem(f"attempt {attempt.token} of job {attempt.job_id} has no start")
            continue
        if attempt.end is None:
            death = died_at.get(pid_of(attempt.worker))
            if death is None:
                report.problem(
                    f"attempt of job {attempt.job_id} by live worker {attempt.worker} never ended"
                )
                continue
            attempt.end = death
            report.killed_attempts += 1
            attempt.token = "killed"
        by_job[attempt.job_id].append(attempt)
    for pk, spans in by_job.items():
        if pk not in jobs:
            report.lost += 1
            report.problem(f"job {pk} was recorded but is gone (lost)")
            continue
        state, resets, failures = jobs[pk]
        spans.sort(key=lambda a: a.start)
        for first, second in itertools.pairwise(spans):
            if second.start < first.end:
                report.overlaps += 1
                report.problem(
                    f"job {pk}: attempts overlapped: {first.worker} "
                    f"[{first.start:.3f}, {first.end:.3f}] and {second.worker} "
                    f"[{second.start:.3f}, {second.end:.3f}]"
                )
        if len(spans) > 1 + resets + failures + max(pk in requeued, requeues[pk]):
            report.problem(
                f"job {pk}: {len(spans)} attempts, only {resets} resets and {failures} failures"
            )
        killed = sum(1 for a in spans if a.token == "killed")
        # The last crash of a job whose reset budget was spent ends it failed, not reset.
        if killed > resets + (state == "failed"):
            workers = ", ".join(f"{a.worker} ({a.token})" for a in spans)
            report.problem(
                f"job {pk} ended {state}: {killed} attempts killed, only {resets} resets; "
                f"attempts by {workers}"
            )
    report.resets = sum(r for _, r, _ in jobs.values())
    report.failures = sum(f for _, _, f in jobs.values())
    if resetter_output is not None:
        logged = Counter()
        for match in RESET_LINE.finditer(resetter_output):
            if match.group(1) != model._meta.label:
                continue
            pk, worker = int(match.group(2)), match.group(3)
            logged[pk] += 1
            if pid_of(worker) not in died_at:
                report.problem(f"job {pk} was reset from worker {worker}, which was alive")
        for pk, (_, resets, _) in jobs.items():
            if logged[pk] != resets:
                report.problem(f"job {pk}: num_resets {resets}, resetter logged {logged[pk]}")
    return report


def peak_overlap(spans):
    """Most spans (start, end) open at one instant: ends before starts at a tie."""
    points = sorted(itertools.chain.from_iterable(((s, 1), (e, -1)) for s, e in spans))
    running = peak = 0
    for _, step in sorted(points, key=lambda p: (p[0], p[1])):
        running += step
        peak = max(peak, running)
    return peak


def limit_audit(died_at, model=None):
    """What fleet-wide limits keyed by ``tenant`` allowed, from the handler's records:
    (most attempts at once, most attempts of one key at once, jobs of a key that started
    before the job ahead of them in the key's order had ended). An attempt cut by a kill
    ends when its process died."""
    from tests.testapp.models import TenantJob

    tenant_of = dict((model or TenantJob).objects.values_list("pk", "tenant"))
    spans, by_key = [], defaultdict(list)
    for attempt in recorded_attempts():
        end = attempt.end or died_at.get(pid_of(attempt.worker))
        assert attempt.start is not None, attempt
        assert end is not None, attempt
        spans.append((attempt.start, end))
        by_key[tenant_of[attempt.job_id]].append((attempt.start, end, attempt.job_id))
    overall = peak_overlap(spans)
    worst_key = max(peak_overlap([(s, e) for s, e, _ in v]) for v in by_key.values())
    # Per key, in ordering (id): a job's first attempt starts after the last attempt of
    # the job before it ended.
    out_of_order = 0
    for attempts in by_key.values():
        first, last = {}, {}
        for s, e, pk in attempts:
            first[pk] = min(first.get(pk, s), s)
            last[pk] = max(last.get(pk, e), e)
        for a, b in itertools.pairwise(sorted(first)):
            out_of_order += first[b] < last[a]
    return overall, worst_key, out_of_order
