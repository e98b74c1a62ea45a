"""A stateful property test of the job lifecycle: Hypothesis generates sequences of
public operations and engine steps, runs each through the real statements on the test
database, and after every step compares the database with the reference model
(``tests/model/lifecycle.py``): every job's state, counters, cancel flag, holder and
whether it is due, and that no unique key is held twice (an active ``key`` and a
waiting-only ``wkey``, held while queued or errored: a job coming back to waiting
while another one holds its ``wkey`` is superseded). Writes of an attempt whose
job was reset (a worker paused past ``stalled_max_age``, then resumed) are in the
sequences too: the model says they never land, so fencing is checked at every step.

Time moves in steps of ``STEP`` seconds by moving the rows' timestamps back in SQL
(``process_after``, ``last_heartbeat_at``, ``started_at``), so every boundary is
hundreds of seconds from the real clock's drift during the test.

Bounded in CI (``CI_SETTINGS``); ``DBWORKER_PROPERTY_FULL=1`` runs it long. A failure
prints the shrunk sequence of steps; keep each as a plain test below
(``test_regression_*``).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_dbworker import Handler, operations
from django_dbworker.control.models import Pause
from django_dbworker.control.pause import pause, resume
from django_dbworker.maintenance.resetter import Resetter
from django_dbworker.sql import superseding
from django_dbworker.sql.connection import Connection
from django_dbworker.sql.jobs import statements_for
from django_dbworker.sql.pause import not_paused
from tests.model.lifecycle import (
    ACTIVE,
    EVENTS,
    PROCESSING,
    WAITING,
    WAITING_KEY,
    Config,
    Lifecycle,
)
from tests.testapp.models import PropertyJob

pytestmark = [pytest.mark.django_db(transaction=True)]

FULL = bool(os.environ.get("DBWORKER_PROPERTY_FULL"))
CI_SETTINGS = settings(
    max_examples=120,
    stateful_step_count=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FULL_SETTINGS = settings(CI_SETTINGS, max_examples=400, stateful_step_count=200)

CONFIG = Config(max_retries=1, max_resets=1, stalled_age=300)
#: The clock's step: a retry delay is two steps, a heartbeat is stale after one.
STEP = 500
KEYS = st.sampled_from([None, None, "k1", "k2"])
#: Waiting-only keys: drawn more often, so that jobs come back to meet their changes.
WKEYS = st.sampled_from([None, "k1", "k1", "k2"])
PRIORITIES = st.sampled_from([0, 5])
QUEUES = st.sampled_from(["a", "b"])
WORKERS = st.sampled_from(["w1", "w2"])
#: At most this many active jobs at a time: steps then work on the same few jobs, taking
#: each through retries, resets and the operator's hands.
MAX_JOBS = 6
PICK = st.integers(0, 7)
PICKS = st.lists(PICK, max_size=3)


class PropertyHandler(Handler):
    model = PropertyJob
    queue_field = "queue"
    ordering = ("-priority", "pk")
    max_num_retries = CONFIG.max_retries
    max_num_resets = CONFIG.max_resets
    stalled_max_age = CONFIG.stalled_age

    def handle(self, job):  # pragma: no cover - the test writes outcomes itself
        pass


class JobLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        PropertyJob.objects.all().delete()
        Pause.objects.all().delete()
        self.model = Lifecycle(CONFIG)
        self.handler = PropertyHandler()
        self.sql = statements_for(PropertyJob, connection.vendor, "default")
        self.db = Connection("default", "properties")
        self.resetter = Resetter([self.handler])
        #: Each worker's current process id (a restart gives it a new one).
        self.ids = {"w1": "w1:0", "w2": "w2:0"}
        self.pks: dict[int, int] = {}  # model ref -> primary key
        self.refs: dict[int, int] = {}
        #: Instances a handler (or the admin's change form) loaded earlier: their
        #: bookkeeping columns are stale by the time they are saved.
        self.loaded: dict[int, PropertyJob] = {}

    def teardown(self) -> None:
        self.db.close()
        self.resetter.close()

    # -- helpers ---------------------------------------------------------------------

    def _map(self, ref: int, pk: int) -> None:
        self.pks[ref], self.refs[pk] = pk, ref

    def _active(self) -> int:
        return sum(job.state in ACTIVE for job in self.model.jobs.values())

    def _attempts(self) -> list[tuple[str, int]]:
        return sorted((w, ref) for w, refs in self.model.held.items() for ref in refs)

    def _refs(self, picks: list[int]) -> list[int]:
        """The jobs ``picks`` names (indexes into the jobs so far, modulo their number:
        a shrunk sequence prints as plain calls)."""
        jobs = sorted(self.model.jobs)
        return sorted({jobs[i % len(jobs)] for i in picks})

    def _queryset(self, refs: list[int]):
        return PropertyJob.objects.filter(pk__in=[self.pks[r] for r in refs])

    def _new_pks(self, count: int) -> list[int]:
        known = max(self.refs, default=0)
        return list(
            PropertyJob.objects.filter(pk__gt=known).order_by("pk").values_list("pk", flat=True)
        )[:count]

    # -- enqueueing ------------------------------------------------------------------

    @precondition(lambda self: self._active() < MAX_JOBS)
    @rule(key=KEYS, priority=PRIORITIES, queue=QUEUES, later=st.booleans(), wkey=WKEYS)
    def enqueue(self, key, priority, queue, later, wkey=None):
        after = timezone.now() + timedelta(seconds=2 * STEP) if later else None
        try:
            with transaction.atomic():
                job = PropertyJob.objects.create(
                    key=key, wkey=wkey, priority=priority, queue=queue, process_after=after
                )
        except IntegrityError:
            job = None
        expected = self.model.enqueue(key, priority, queue, 2 * STEP if later else 0, wkey)
        assert (job is None) == (expected is None), "a held key refused, a free one taken"
        if job is not None:
            self._map(expected.ref, job.pk)

    @precondition(
        lambda self: (
            self._active() < MAX_JOBS
            and any(j.state == PROCESSING and j.wkey for j in self.model.jobs.values())
        )
    )
    @rule(pick=PICK, later=st.booleans())
    def enqueue_change_of_a_running_job(self, pick, later):
        """A change of a running job comes (its waiting-only key is free): the job may
        then come back to waiting while the change holds the key."""
        running = sorted(
            j.ref for j in self.model.jobs.values() if j.state == PROCESSING and j.wkey
        )
        wkey = self.model.jobs[running[pick % len(running)]].wkey
        self.enqueue(None, 0, "a", later, wkey=wkey)

    @precondition(lambda self: self._active() < MAX_JOBS)
    @rule(key=KEYS, priority=PRIORITIES, queue=QUEUES, replace=st.booleans(), by_wkey=st.booleans())
    def enqueue_unique(self, key, priority, queue, replace, by_wkey=False):
        job, created = PropertyJob.objects.enqueue_unique(
            **{"wkey" if by_wkey else "key": key},
            priority=priority,
            queue=queue,
            on_conflict="replace" if replace else "skip",
        )
        expected, expected_created = self.model.enqueue_unique(
            key, priority, queue, replace, by_wkey
        )
        assert created == expected_created
        if created:
            self._map(expected.ref, job.pk)
        else:
            assert job.pk == self.pks[expected.ref], "the holder is returned"

    @precondition(lambda self: self._active() < MAX_JOBS)
    @rule(specs=st.lists(st.tuples(KEYS, PRIORITIES, QUEUES), min_size=1, max_size=3))
    def bulk_enqueue(self, specs):
        objs = [PropertyJob(key=k, priority=p, queue=q) for k, p, q in specs]
        try:
            with transaction.atomic():
                PropertyJob.objects.bulk_enqueue(objs)
            done = True
        except IntegrityError:
            done = False
        expected = self.model.bulk_enqueue(specs)
        assert done == (expected is not None), "bulk_enqueue: a held key refuses the batch"
        if expected is not None:
            for job, pk in zip(expected, self._new_pks(len(expected)), strict=True):
                self._map(job.ref, pk)

    # -- the worker ------------------------------------------------------------------

    def _claim(self, worker_id: str, limit: int) -> list[int]:
        where, params = not_paused(self.handler, self.sql, "default", Pause)
        held = sorted(self.pks[r] for r in self.model.held.get(worker_id, ()))
        rows = self.db.execute(
            self.sql.claim(self.sql.order_by(self.handler.ordering), where),
            {
                **params,
                "worker": worker_id,
                "max_retries": CONFIG.max_retries,
                "held": self.sql.ids_param(held),
                "limit": limit,
            },
        )
        return sorted(self.sql.key(row[self.sql.rows.pk_index]) for row in rows)

    @rule(worker=WORKERS, limit=st.integers(1, 2))
    def claim(self, worker, limit):
        worker_id = self.ids[worker]
        got = self._claim(worker_id, limit)
        expected = self.model.claim(worker_id, limit)
        assert got == sorted(self.pks[j.ref] for j in expected), "claim order or claimability"

    @rule(worker=WORKERS)
    def claim_reply_lost(self, worker):
        """The claim committed; its reply never reached the worker."""
        worker_id = self.ids[worker]
        got = self._claim(worker_id, 1)
        expected = self.model.claim(worker_id, 1, remember=False)
        assert got == sorted(self.pks[j.ref] for j in expected)

    @rule(worker=WORKERS)
    def requeue_unheld(self, worker):
        worker_id = self.ids[worker]
        held = sorted(self.pks[r] for r in self.model.held.get(worker_id, ()))
        got = superseding.requeue_unheld(self.db, self.sql, worker_id, held, "lost reply")
        expected = self.model.requeue_unheld(worker_id)
        assert got == {self.pks[r]: s for r, s in expected.items()}, "requeue_unheld"

    @rule(worker=WORKERS)
    def heartbeat(self, worker):
        worker_id = self.ids[worker]
        held = sorted(self.pks[r] for r in self.model.held.get(worker_id, ()))
        rows = self.db.execute(
            self.sql.heartbeat, {"ids": self.sql.ids_param(held), "worker": worker_id}
        )
        got = {self.sql.key(pk): bool(cancel) for pk, cancel in rows}
        expected = {self.pks[r]: c for r, c in self.model.heartbeat(worker_id).items()}
        assert got == expected, "a heartbeat refreshes its own rows only, with their cancel"

    @rule(worker=WORKERS)
    def restart(self, worker):
        """The process is replaced (its old attempts linger: a paused process that
        resumes later writes through them)."""
        number = int(self.ids[worker].split(":")[1]) + 1
        self.ids[worker] = f"{worker}:{number}"

    def _attempt(self, pick: int) -> tuple[str, int]:
        attempts = self._attempts()
        return attempts[pick % len(attempts)]

    @precondition(lambda self: self.model.held and any(self.model.held.values()))
    @rule(pick=PICK)
    def complete(self, pick):
        worker_id, ref = self._attempt(pick)
        rows = self.db.execute(
            self.sql.complete,
            {"ids": self.sql.ids_param([self.pks[ref]]), "worker": worker_id},
        )
        assert bool(rows) == self.model.complete(worker_id, ref), "fencing: complete"

    @precondition(lambda self: self.model.held and any(self.model.held.values()))
    @rule(pick=PICK, later=st.booleans(), non_retryable=st.booleans())
    def error(self, pick, later, non_retryable):
        worker_id, ref = self._attempt(pick)
        delay = 2 * STEP if later else 0
        rows = superseding.error(
            self.db,
            self.sql,
            self.sql.error,
            {
                "non_retryable": non_retryable,
                "max_retries": CONFIG.max_retries,
                "message": "boom",
                "delay": float(delay) if delay else None,  # as the completer sends it
                "pk": self.pks[ref],
                "worker": worker_id,
            },
        )
        expected = self.model.error(worker_id, ref, delay, non_retryable)
        assert [r[0] for r in rows] == ([] if expected is None else [expected]), "error"

    @precondition(lambda self: self.model.held and any(self.model.held.values()))
    @rule(pick=PICK, later=st.booleans())
    def snooze(self, pick, later):
        worker_id, ref = self._attempt(pick)
        delay = 2 * STEP if later else 0
        rows = self.db.execute(
            self.sql.snooze,
            {
                "message": "snoozed",
                "delay": float(delay) if delay else None,  # as the completer sends it
                "pk": self.pks[ref],
                "worker": worker_id,
            },
        )
        expected = self.model.snooze(worker_id, ref, delay)
        assert [r[0] for r in rows] == ([] if expected is None else [expected]), "snooze"

    @precondition(lambda self: self.model.held and any(self.model.held.values()))
    @rule(pick=PICK)
    def cancel_outcome(self, pick):
        worker_id, ref = self._attempt(pick)
        rows = self.db.execute(
            self.sql.cancel,
            {
                "message": "canceled",
                "ids": self.sql.ids_param([self.pks[ref]]),
                "worker": worker_id,
            },
        )
        assert bool(rows) == self.model.cancel_outcome(worker_id, ref), "fencing: cancel"

    @precondition(lambda self: self.model.held and any(self.model.held.values()))
    @rule(pick=PICK)
    def requeue_at_shutdown(self, pick):
        worker_id, ref = self._attempt(pick)
        got = superseding.requeue(self.db, self.sql, [self.pks[ref]], worker_id, "shutdown")
        expected = self.model.requeue(worker_id, ref)
        assert got == ({} if expected is None else {self.pks[ref]: expected}), "requeue"

    # Rules are drawn alike: these make the steps that take a job further drawn more.

    @rule(worker=WORKERS)
    def claim_too(self, worker):
        self.claim(worker, 1)

    @precondition(lambda self: self.model.held and any(self.model.held.values()))
    @rule(pick=PICK, later=st.booleans())
    def error_too(self, pick, later):
        self.error(pick, later, non_retryable=False)

    @precondition(lambda self: self.model.held and any(self.model.held.values()))
    @rule(pick=PICK)
    def cancel_running_then_error(self, pick):
        """The operator cancels a running job; its handler raises (``JobCanceled``)."""
        attempt = self._attempt(pick)
        self.operator_cancel([sorted(self.model.jobs).index(attempt[1])])
        self.error(self._attempts().index(attempt), False, non_retryable=False)

    # -- time and the resetter -------------------------------------------------------

    @rule()
    def advance_clock(self):
        back = timedelta(seconds=STEP)
        PropertyJob.objects.update(
            process_after=F("process_after") - back,
            last_heartbeat_at=F("last_heartbeat_at") - back,
            started_at=F("started_at") - back,
        )
        self.model.advance(STEP)

    @rule()
    def stage(self):
        """A worker's stager: the jobs that waited for a time and are due."""
        rows = self.db.execute(self.sql.stage)
        expected = self.model.stage()
        assert sorted(self.sql.keys(rows)) == sorted(self.pks[r] for r in expected), "stage"

    @rule()
    def reset_pass(self):
        [report] = self.resetter.run_once()
        reset, failed, superseded = self.model.reset_pass()
        assert sorted(report.reset) == sorted(self.pks[r] for r in reset), "resets"
        assert sorted(report.superseded) == sorted(self.pks[r] for r in superseded), "superseded"
        assert sorted(report.failed) == sorted(self.pks[r] for r in failed), "failed resets"

    # -- the operator ----------------------------------------------------------------

    @precondition(lambda self: self.model.jobs)
    @rule(picks=PICKS)
    def operator_cancel(self, picks):
        refs = self._refs(picks)
        operations.cancel(self._queryset(refs))
        self.model.operator_cancel(refs)

    @precondition(lambda self: self.model.jobs)
    @rule(picks=PICKS, reset_counters=st.booleans())
    def operator_retry(self, picks, reset_counters):
        refs = self._refs(picks)
        done = operations.retry(self._queryset(refs), reset_counters=reset_counters)
        held = self.model.operator_retry(refs, reset_counters)
        got = {self.refs[pk]: self.refs.get(holder) for pk, holder in done.held.items()}
        assert got == held, "retry: the jobs whose key is held stay, with their holder"

    @precondition(lambda self: self.model.jobs)
    @rule(picks=PICKS)
    def run_now(self, picks):
        refs = self._refs(picks)
        operations.run_now(self._queryset(refs))
        self.model.run_now(refs)

    @precondition(lambda self: not self.model.paused)
    @rule(queue=QUEUES)
    def pause_queue(self, queue):
        pause(self.handler.queue_pause_prefix() + queue)
        self.model.pause(queue)

    @rule(queue=QUEUES)
    def resume_queue(self, queue):
        resume(self.handler.queue_pause_prefix() + queue)
        self.model.resume(queue)

    # -- job.save() of an instance loaded earlier -------------------------------------

    @precondition(lambda self: self.model.jobs)
    @rule(pick=PICK)
    def load(self, pick):
        """A handler (or the admin's change form) loads a job."""
        [ref] = self._refs([pick])
        self.loaded[ref] = PropertyJob.objects.get(pk=self.pks[ref])

    @precondition(lambda self: self.loaded)
    @rule(pick=PICK, priority=PRIORITIES)
    def save_loaded(self, pick, priority):
        """... and saves it later, a domain field changed: whatever happened to the job
        meanwhile (claimed, canceled, reset, finished), ``save()`` writes only the
        domain columns, never the state, counters, cancel flag or holder it loaded."""
        refs = sorted(self.loaded)
        ref = refs[pick % len(refs)]
        job = self.loaded[ref]
        job.priority = priority
        try:
            with transaction.atomic():
                job.save()
        except IntegrityError as exc:  # a stale state written back took a held key
            raise AssertionError(f"save() of job {ref} wrote a bookkeeping column: {exc}") from exc
        self.model.jobs[ref].priority = priority
        self.model.jobs[ref].queue = job.queue  # a domain column too: the stale value
        EVENTS["stale saves"] += 1

    # -- what must hold after every step ---------------------------------------------

    @invariant()
    def database_agrees_with_the_model(self):
        EVENTS["steps"] += 1
        now = timezone.now()
        rows = {
            row["pk"]: row
            for row in PropertyJob.objects.values(
                "pk",
                "state",
                "num_failures",
                "num_resets",
                "num_snoozes",
                "cancel",
                "worker_hostname",
                "process_after",
                "key",
                "wkey",
                "priority",
                "queue",
            )
        }
        assert sorted(rows) == sorted(self.pks.values()), "no job made or lost"
        for ref, job in self.model.jobs.items():
            row = rows[self.pks[ref]]
            got = (
                row["state"],
                row["num_failures"],
                row["num_resets"],
                row["num_snoozes"],
                row["cancel"],
                row["priority"],
                row["queue"],
                row["key"],
                row["wkey"],
            )
            expected = (
                job.state,
                job.num_failures,
                job.num_resets,
                job.num_snoozes,
                job.cancel,
                job.priority,
                job.queue,
                job.key,
                job.wkey,
            )
            assert got == expected, f"job {ref} (pk {row['pk']}): {got} != {expected}"
            if job.state == PROCESSING:
                assert row["worker_hostname"] == job.worker, f"job {ref}: its holder"
            if job.state in WAITING:
                due = row["process_after"] is None or row["process_after"] <= now
                assert due == (job.wait <= 0), f"job {ref}: due is {due}"
                timed = row["process_after"] is not None
                assert timed == job.timed, f"job {ref}: waits for a time is {timed}"

    @invariant()
    def one_active_job_per_key(self):
        keys = list(
            PropertyJob.objects.filter(state__in=ACTIVE, key__isnull=False).values_list(
                "key", flat=True
            )
        )
        assert len(keys) == len(set(keys)), f"a unique key held twice: {sorted(keys)}"
        wkeys = list(
            PropertyJob.objects.filter(state__in=WAITING_KEY, wkey__isnull=False).values_list(
                "wkey", flat=True
            )
        )
        assert len(wkeys) == len(set(wkeys)), f"a waiting key held twice: {sorted(wkeys)}"


@pytest.mark.timeout(3600 if FULL else 300)
def test_the_job_lifecycle_follows_the_model():
    EVENTS.clear()
    started = time.monotonic()
    run_state_machine_as_test(JobLifecycle, settings=FULL_SETTINGS if FULL else CI_SETTINGS)
    print(f"\n{connection.vendor}: {time.monotonic() - started:.0f}s", dict(EVENTS))


# -- regression examples: shrunk sequences the property test found -----------------------


def _run(steps):
    """Run ``steps`` (method name, keyword arguments) on a fresh machine, checking the
    invariants after each, as Hypothesis does."""
    machine = JobLifecycle()
    try:
        for name, kwargs in [("database_agrees_with_the_model", {}), *steps]:
            getattr(machine, name)(**kwargs)
            machine.database_agrees_with_the_model()
            machine.one_active_job_per_key()
    finally:
        machine.teardown()


def test_a_reset_job_claimed_again_fences_its_stale_attempt():
    """Written, not found: a worker stalls, its job is reset and claimed by another
    worker; the stale attempt's heartbeat, outcome and requeue land nowhere, and the
    second unique enqueue meets the key held all along."""
    _run(
        [
            ("enqueue", {"key": "k1", "priority": 0, "queue": "a", "later": False}),
            ("claim", {"worker": "w1", "limit": 1}),
            ("advance_clock", {}),
            ("reset_pass", {}),
            ("enqueue_unique", {"key": "k1", "priority": 5, "queue": "b", "replace": True}),
            ("claim", {"worker": "w2", "limit": 2}),
            ("heartbeat", {"worker": "w1"}),
            ("complete", {"pick": 0}),  # w1's stale attempt: refused
            ("requeue_at_shutdown", {"pick": 0}),  # w2's: lands
            ("claim", {"worker": "w1", "limit": 1}),
            ("error", {"pick": 0, "later": True, "non_retryable": False}),
            ("run_now", {"picks": [0]}),
            ("claim", {"worker": "w1", "limit": 1}),
            ("error", {"pick": 0, "later": False, "non_retryable": False}),
        ]
    )


def test_regression_bulk_enqueue_of_a_held_key_raises_integrity_error():
    """Found by the property test on PostgreSQL: COPY raised psycopg's UniqueViolation,
    not Django's IntegrityError (so ``except IntegrityError`` missed it)."""
    _run([("bulk_enqueue", {"specs": [("k1", 0, "a"), ("k1", 0, "a")]})])
    _run(
        [
            ("enqueue", {"key": "k1", "priority": 0, "queue": "a", "later": False}),
            ("bulk_enqueue", {"specs": [(None, 0, "a"), ("k1", 5, "b")]}),
        ]
    )


def test_regression_a_stale_save_writes_back_the_queue_replace_changed():
    """Found by the property test (SQLite, PostgreSQL): ``enqueue_unique(replace)``
    moved the holder to another queue, then a save of the job loaded before wrote its
    old queue back, as ``save()`` does with every domain column; the reference model
    kept the new one."""
    _run(
        [
            ("bulk_enqueue", {"specs": [("k1", 0, "a")]}),
            ("load", {"pick": 0}),
            ("enqueue_unique", {"key": "k1", "priority": 0, "queue": "b", "replace": True}),
            ("save_loaded", {"pick": 0, "priority": 0}),
        ]
    )


def test_snoozes_leave_the_retry_budget_and_a_cancel_wins():
    """Snoozes (issue 44) count apart: a job snoozed then errored keeps its whole
    budget; a snooze of a stale attempt lands nowhere; a cancel asked meanwhile wins."""
    _run(
        [
            ("enqueue", {"key": None, "priority": 0, "queue": "a", "later": False}),
            ("claim", {"worker": "w1", "limit": 1}),
            ("snooze", {"pick": 0, "later": True}),
            ("claim", {"worker": "w1", "limit": 1}),  # not due: nothing to claim
            ("run_now", {"picks": [0]}),
            ("claim", {"worker": "w1", "limit": 1}),
            ("snooze", {"pick": 0, "later": False}),
            ("claim", {"worker": "w2", "limit": 1}),
            ("error", {"pick": 0, "later": False, "non_retryable": False}),
            ("claim", {"worker": "w1", "limit": 1}),
            ("advance_clock", {}),
            ("reset_pass", {}),
            ("claim", {"worker": "w2", "limit": 1}),
            ("snooze", {"pick": 0, "later": False}),  # w2's attempt: lands
        ]
    )


def test_a_job_back_to_waiting_while_its_change_waits_is_superseded():
    """Written, not found (issue 42, item 14): a job whose waiting-only key (``wkey``)
    another job took while it ran comes back to waiting by a requeue at shutdown, an
    error with retries left, and a reset: superseded each time (the model says
    canceled, nothing counted); the operator's retry of it reports the holder."""
    new = {"priority": 0, "queue": "a", "key": None}
    _run(
        [
            ("enqueue", {**new, "wkey": "k1", "later": False}),
            ("claim", {"worker": "w1", "limit": 1}),
            ("enqueue", {**new, "wkey": "k1", "later": True}),  # the change: taken
            ("requeue_at_shutdown", {"pick": 0}),  # superseded by the change
            ("enqueue", {**new, "wkey": "k2", "later": False}),
            ("claim", {"worker": "w1", "limit": 1}),
            ("enqueue_unique", {**new, "key": "k2", "replace": True, "by_wkey": True}),
            ("error", {"pick": 0, "later": True, "non_retryable": False}),  # superseded
            ("operator_retry", {"picks": [0, 2], "reset_counters": False}),  # both held
            ("enqueue", {**new, "wkey": None, "later": False}),
            ("enqueue", {**new, "wkey": None, "later": False}),
            ("claim", {"worker": "w2", "limit": 2}),
            ("advance_clock", {}),
            ("reset_pass", {}),
        ]
    )
