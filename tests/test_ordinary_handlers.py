"""The guarantees with handlers written the way Django code is written.

They save their job, use the ORM in every hook (and the async ORM), log inside
their own transactions, share a table with other handlers, use UUID keys, a
connection pool and a read replica. Each test is one finding of the hardening
review (issue 10); each failed before its fix.
"""

import contextlib
import itertools
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection
from django.db.models import Q
from django.test import override_settings
from django.utils import timezone

from django_dbworker.exceptions import CancelReason
from tests.chaos.conftest import outage, terminate_backends
from tests.conftest import wait_until
from tests.factories import JobFactory, RepositoryFactory
from tests.testapp import handlers as h
from tests.testapp.models import Event, QueueJob, UUIDJob

pytestmark = pytest.mark.django_db(transaction=True)

ON_POSTGRES = connection.vendor == "postgresql"
postgres_only = pytest.mark.skipif(not ON_POSTGRES, reason="needs PostgreSQL")
row_locks_only = pytest.mark.skipif(
    connection.vendor not in ("postgresql", "mysql"), reason="needs PostgreSQL or MariaDB"
)
sqlite_only = pytest.mark.skipif(ON_POSTGRES, reason="SQLite's write lock")


def state(job):
    return QueueJob.objects.get(pk=job.pk).state


def spans(job):
    """(start, end) of each attempt the test handler recorded for ``job``."""
    starts = list(Event.objects.filter(job_id=job.pk, kind="start").values_list("at", flat=True))
    ends = list(Event.objects.filter(job_id=job.pk, kind="end").values_list("at", flat=True))
    return list(zip(starts, ends, strict=False))


def overlapping(job):
    ordered = sorted(spans(job))
    return [(a, b) for a, b in itertools.pairwise(ordered) if b[0] < a[1]]


# -- 1. A failover breaks no hook that uses the ORM in the dispatcher thread ----------


@row_locks_only
def test_orm_hooks_survive_terminated_connections(run_worker):
    RepositoryFactory()
    first = JobFactory()
    tw = run_worker(h.OrmHooksHandler(interval=0.05, max_interval=0.1))
    wait_until(lambda: state(first) == "completed", 15, message="the first job")
    assert terminate_backends() > 0  # the dispatcher's, heartbeat's, writer's, ...
    later = JobFactory.create_batch(5, repository=RepositoryFactory())
    wait_until(lambda: all(state(job) == "completed" for job in later), 20, message="jobs after it")
    assert tw.stop() == 0


# -- 2. async def handle: the async ORM and the log, across a failover ----------------


def test_async_handle_uses_the_async_orm_and_writes_its_log(run_worker):
    jobs = JobFactory.create_batch(4)
    assert run_worker(h.AsyncOrmHandler(num_handlers=2), burst=True).join() == 0
    for job in jobs:
        job.refresh_from_db()
        assert job.state == "completed", job.failure_message
        [entry] = job.execution_logs
        assert (entry["key"], entry["out"], entry["exit_code"]) == ("async", "rows: 1", 0)


@row_locks_only
def test_async_handle_keeps_working_after_its_connections_are_killed(run_worker):
    first = JobFactory()
    tw = run_worker(h.AsyncOrmHandler(num_handlers=2, interval=0.05, max_interval=0.1))
    wait_until(lambda: state(first) == "completed", 15, message="the first job")
    terminate_backends()
    later = JobFactory.create_batch(4)
    wait_until(
        lambda: all(state(job) in ("completed", "failed", "errored") for job in later),
        20,
        message="jobs after the kill",
    )
    assert {state(job) for job in later} == {"completed"}
    assert tw.stop() == 0


def test_async_handle_is_cancelled_as_a_task(run_worker):
    job = JobFactory(behavior="sleep", payload={"seconds": 30})
    tw = run_worker(h.AsyncOrmHandler())
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="start").exists(), 15)
    QueueJob.objects.filter(pk=job.pk).update(cancel=True)
    wait_until(lambda: state(job) == "canceled", 10, message="the cancelled coroutine")
    assert tw.stop() == 0


# -- 3. job.save() writes only the job's own columns --------------------------------


def test_save_of_a_running_job_keeps_heartbeat_and_cancel_flag():
    job = JobFactory(state="processing", worker_hostname="w:1:a")
    stale = QueueJob.objects.get(pk=job.pk)
    beat = timezone.now()
    QueueJob.objects.filter(pk=job.pk).update(last_heartbeat_at=beat, cancel=True)
    stale.payload = {"progress": 50}
    stale.save()
    job.refresh_from_db()
    assert job.payload == {"progress": 50}
    assert (job.last_heartbeat_at, job.cancel, job.state) == (beat, True, "processing")


def test_save_never_resurrects_a_deleted_job():
    job = JobFactory()
    stale = QueueJob.objects.get(pk=job.pk)
    QueueJob.objects.filter(pk=job.pk).delete()
    stale.payload = {"late": True}
    with pytest.raises(DatabaseError):
        stale.save()
    assert not QueueJob.objects.filter(pk=job.pk).exists()


def test_save_writes_bookkeeping_columns_named_in_update_fields_and_new_jobs_whole():
    job = QueueJob(behavior="ok", state="errored", num_failures=2)
    job.save()
    job.refresh_from_db()
    assert (job.state, job.num_failures) == ("errored", 2)
    job.state = "queued"
    job.save(update_fields=["state"])
    assert QueueJob.objects.get(pk=job.pk).state == "queued"


def test_a_handler_saving_its_job_writes_back_neither_heartbeat_nor_cancel_flag(run_worker):
    """It saves after several heartbeats (the row loaded at claim time is stale by then):
    the heartbeat in the row does not go back to the claim's. And an operator cancels a
    job just before its handler saves it: the cancellation stands."""
    kept = JobFactory(payload={"seconds": 1.0})
    canceled = JobFactory(payload={"seconds": 0.1, "after": 10, "cancel_first": True})
    handler = h.SavingHandler(num_handlers=2, heartbeat_interval=0.2)
    run_worker(handler, burst=True).join()
    kept.refresh_from_db()
    assert (kept.state, kept.num_resets, kept.payload["saved"]) == ("completed", 0, True)
    assert not Event.objects.filter(job_id=kept.pk, kind="heartbeat went back").exists()
    assert state(canceled) == "canceled"


# -- 4. One table, several handlers: each job judged by its own handler ---------------


class SlowBeats(h.BehaviorHandler):
    dequeue_filter = Q(behavior="sleep")
    heartbeat_interval = 1.5
    stalled_max_age = timedelta(seconds=30)


class FastResets(h.BehaviorHandler):
    dequeue_filter = ~Q(behavior="sleep")
    heartbeat_interval = 0.1
    stalled_max_age = timedelta(seconds=0.5)


def test_the_resetter_of_one_handler_spares_live_jobs_of_another(run_worker):
    slow = JobFactory(behavior="sleep", payload={"seconds": 3})
    run_worker(SlowBeats(), with_resetter=False)
    wait_until(lambda: state(slow) == "processing", 10)
    run_worker(FastResets(), with_resetter=True)  # a resetter that allows 0.5 s
    wait_until(lambda: state(slow) == "completed", 20, message="the slow job")
    slow.refresh_from_db()
    assert slow.num_resets == 0
    assert len(spans(slow)) == 1


# -- 5. maximum runtime counts from the start, not the claim -------------------------


def test_prefetched_jobs_do_not_time_out_while_waiting_for_a_thread(run_worker):
    jobs = JobFactory.create_batch(4, behavior="sleep", payload={"seconds": 0.3})
    handler = h.BehaviorHandler(num_handlers=1, prefetch=3, maximum_runtime_per_job=0.6)
    assert run_worker(handler, burst=True).join() == 0
    for job in jobs:
        job.refresh_from_db()
        assert (job.state, job.num_failures) == ("completed", 0), job.failure_message


# -- 6. Two lanes of one process never hold one job at once ---------------------------


class BlockLane(h.BehaviorHandler):
    dequeue_filter = Q(behavior="block")
    num_handlers = 1


class AnyLane(h.BehaviorHandler):
    num_handlers = 1
    interval = 0.02


def test_a_reset_job_is_not_claimed_by_a_second_lane_while_the_first_holds_it(run_worker):
    """The first attempt ignores cancellation and runs on after its job was reset (as a
    paused worker's would): the second lane of the same process must not take the job
    before the first lets go of it, since both would write as the same worker."""
    job = JobFactory(behavior="block", payload={"seconds": 1.0})
    tw = run_worker([BlockLane(), AnyLane()], with_resetter=False)
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="start").exists(), 10)
    # What a resetter does to a job it believes dead: back to queued.
    QueueJob.objects.filter(pk=job.pk).update(state="queued", num_resets=1)
    wait_until(lambda: len(spans(job)) >= 2, 15, message="the second attempt")
    assert overlapping(job) == []
    assert tw.stop() == 0


# -- 7. interrupt_on_cancel reaches handlers that swallow errors -----------------------


@pytest.mark.parametrize("swallow_once", [False, True])
def test_interrupt_on_cancel_stops_a_handler_that_swallows_errors(run_worker, swallow_once):
    job = JobFactory(behavior="spin", payload={"seconds": 20, "swallow_once": swallow_once})
    tw = run_worker(h.SwallowingHandler(heartbeat_interval=0.2))
    wait_until(lambda: state(job) == "processing", 10)
    time.sleep(0.3)
    QueueJob.objects.filter(pk=job.pk).update(cancel=True)
    wait_until(lambda: state(job) == "canceled", 10, message="the interrupted handler")
    assert tw.stop() == 0


# -- 8. Logging inside the handler's own transaction, its row locked ------------------


@override_settings(DBWORKER={"RESET_INTERVAL": 0.5, "STATEMENT_TIMEOUT": None})
def test_logging_with_the_job_row_locked_blocks_nothing_and_loses_nothing(run_worker):
    locking = JobFactory(behavior="lock", payload={"hold": 1.0})
    others = JobFactory.create_batch(3, behavior="log")
    handler = h.LockingLogHandler(num_handlers=2)
    handler_others = h.BehaviorHandler(num_handlers=2)
    tw = run_worker([handler, handler_others])
    wait_until(lambda: state(locking) == "completed", 20, message="the locking job")
    wait_until(lambda: all(state(j) == "completed" for j in others), 20)
    locking.refresh_from_db()
    assert [e["key"] for e in locking.execution_logs] == ["locked"]
    assert locking.execution_logs[0]["out"] == "inside the transaction"
    assert locking.payload["locked"] is True
    assert tw.stop() == 0


# -- 9. UUID keys --------------------------------------------------------------------


def test_uuid_keyed_jobs_heartbeat_log_cancel_and_finish(run_worker):
    done = [UUIDJob.objects.create(behavior="sleep", payload={"seconds": 0.6}) for _ in range(3)]
    failing = UUIDJob.objects.create(behavior="fail")
    canceled = UUIDJob.objects.create(behavior="sleep", payload={"seconds": 30})
    tw = run_worker(h.UUIDHandler())
    wait_until(lambda: UUIDJob.objects.get(pk=canceled.pk).state == "processing", 10)
    before = UUIDJob.objects.get(pk=canceled.pk).last_heartbeat_at
    wait_until(
        lambda: UUIDJob.objects.get(pk=canceled.pk).last_heartbeat_at > before,
        5,
        message="a heartbeat",
    )
    UUIDJob.objects.filter(pk=canceled.pk).update(cancel=True)
    wait_until(lambda: UUIDJob.objects.get(pk=canceled.pk).state == "canceled", 10)
    wait_until(lambda: not UUIDJob.objects.filter(state="processing").exists(), 10)
    assert tw.stop() == 0
    for job in done:
        job.refresh_from_db()
        assert (job.state, job.payload["done"]) == ("completed", True)
        assert job.execution_logs[0]["out"] == "hello"
        assert job.execution_logs[0]["command"] == ["echo", "hello"]
    assert UUIDJob.objects.get(pk=failing.pk).state == "failed"


# -- 10. bulk_enqueue honours defaults like save() on every database -------------------


def test_bulk_enqueue_applies_auto_now_add_and_python_and_database_defaults():
    before = timezone.now()
    count = UUIDJob.objects.bulk_enqueue([UUIDJob(behavior="ok") for _ in range(3)])
    assert count == 3
    rows = list(UUIDJob.objects.all())
    assert len(rows) == 3
    for row in rows:
        assert isinstance(row.pk, uuid.UUID)
        assert row.created_at >= before - timedelta(seconds=1)
        assert len(row.token) == 32
        assert row.source == "database"
        assert row.state == "queued"
    assert len({row.token for row in rows}) == 3


# -- 11. A forced stop requeues prefetched jobs that never started ---------------------


def test_a_forced_stop_requeues_prefetched_jobs_unrun(run_worker):
    """The running job ignores cancellation past the forced stop's 5 s: the jobs waiting
    behind it never get a thread, and must not stay ``processing``."""
    running = JobFactory(behavior="block", payload={"seconds": 8})
    waiting = JobFactory.create_batch(3, behavior="ok")
    tw = run_worker(h.BehaviorHandler(num_handlers=1, prefetch=3))
    wait_until(lambda: Event.objects.filter(job_id=running.pk, kind="start").exists(), 10)
    wait_until(
        lambda: QueueJob.objects.filter(state="processing").count() == 4, 10, message="the prefetch"
    )
    tw.stop(force=True)
    for job in waiting:
        job.refresh_from_db()
        assert (job.state, job.num_resets, job.num_failures) == ("queued", 0, 0)
        assert not Event.objects.filter(job_id=job.pk, kind="start").exists()


# -- 12. Django's connection pool -----------------------------------------------------


@postgres_only
@pytest.mark.subprocess
def test_a_worker_under_djangos_connection_pool_keeps_no_pooled_connection(spawn):
    """A pool of 3: the worker's own connections (dispatcher, heartbeat, writer, listener,
    resetter) stay outside it, and each handler thread gives its one back after a job."""
    jobs = JobFactory.create_batch(20, behavior="log")
    proc = spawn(
        "runworker",
        "tests.testapp.handlers.BehaviorHandler",
        "--num-handlers",
        "3",
        "--burst",
        env={"DBWORKER_TEST_POOL": "1"},
    )
    assert proc.wait(90) == 0, proc.output
    assert {state(job) for job in jobs} == {"completed"}
    assert "couldn't get a connection" not in proc.output


# -- 13. SQLite: a handler holding the write lock is not taken for dead ----------------


class HoldsTheWriteLock(h.BehaviorHandler):
    heartbeat_interval = 0.2
    stalled_max_age = timedelta(seconds=1)

    def behave(self, job):
        from django.db import transaction

        for _ in range(job.payload.get("times", 3)):  # each time, a resetter may race in
            with transaction.atomic():
                Event.objects.create(job_id=job.pk, kind="locked", at=time.time())
                time.sleep(job.payload.get("hold", 1.5))
            time.sleep(0.5)


@sqlite_only
def test_sqlite_a_job_holding_the_write_lock_past_stalled_max_age_is_not_reset(run_worker):
    """A resetter of another process (here a thread with a resetter of its own, which
    spares nothing) waits for the lock too: it must not take the live job after."""
    from django_dbworker.maintenance.resetter import Resetter

    job = JobFactory(behavior="ok", payload={"hold": 1.5, "times": 3})
    handler = HoldsTheWriteLock()
    tw = run_worker(handler, with_resetter=False)
    done = threading.Event()

    def other_resetter():
        resetter = Resetter([HoldsTheWriteLock()])
        try:
            while not done.is_set():
                with contextlib.suppress(Exception):
                    resetter.run_once()
                done.wait(0.3)
        finally:
            resetter.close()

    thread = threading.Thread(target=other_resetter, daemon=True)
    thread.start()
    try:
        wait_until(lambda: state(job) == "completed", 30, message="the job holding the lock")
        time.sleep(1.5)  # resetter passes after the lock went
    finally:
        done.set()
        thread.join(10)
    job.refresh_from_db()
    assert (job.state, job.num_resets) == ("completed", 0)
    assert len(spans(job)) == 1
    assert tw.stop() == 0


# -- 14. Models that override __init__ or from_db get them called ---------------------


def test_job_models_overriding_init_or_from_db_are_built_through_them(run_worker):
    from tests.testapp.models import InitJob

    jobs = [InitJob.objects.create(behavior="init") for _ in range(3)]
    assert run_worker(h.InitHandler(), burst=True).join() == 0
    for job in jobs:
        job.refresh_from_db()
        assert job.state == "completed", job.failure_message


# -- 15. Jobs are read from the database they were claimed on -------------------------


class ReplicaRouter:
    """Sends reads to a replica (an alias that does not even exist here: no read of a
    claimed job may go there)."""

    def db_for_read(self, model, **hints):
        return "replica"

    def db_for_write(self, model, **hints):
        return "default"


class Recorder(h.EagerHandler):
    def __init__(self, **options):
        super().__init__(**options)
        self.seen = []

    def handle(self, job):
        self.seen.append((job._state.db, "repository" in job._state.fields_cache))


def test_claimed_jobs_are_reloaded_from_the_primary_not_a_replica(run_worker, caplog):
    JobFactory.create_batch(3, repository=RepositoryFactory())
    handler = Recorder()
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ReplicaRouter"]):
        assert run_worker(handler, burst=True).join() == 0
    # Loaded through get_queryset (select_related), from the database of the claim.
    assert handler.seen == [("default", True)] * 3
    assert "get_queryset() raised" not in caplog.text


# -- 16. A batch starts in claim order ------------------------------------------------


class Ordered(h.BehaviorHandler):
    ordering = ("-priority", "id")
    num_handlers = 1
    prefetch = 9


def test_jobs_of_one_batch_start_in_the_handlers_ordering(run_worker):
    priorities = [3, 9, 1, 7, 5, 0, 8, 2, 6, 4]
    jobs = {JobFactory(priority=p).pk: p for p in priorities}
    assert run_worker(Ordered(), burst=True).join() == 0
    started = list(Event.objects.filter(kind="start").values_list("job_id", flat=True))
    assert [jobs[pk] for pk in started] == sorted(priorities, reverse=True)


# -- 17. The log keeps the tail of long output -----------------------------------------


class Chatty(h.BehaviorHandler):
    def behave(self, job):
        entry = self.attempt.log("build", "make all")
        for i in range(30):
            entry.write(f"line {i:02d}\n")
        entry.finish(exit_code=2)


@override_settings(DBWORKER={"RESET_INTERVAL": 0.5, "MAX_LOG_OUTPUT_LENGTH": 100})
def test_long_output_keeps_its_tail_and_says_how_much_was_cut(run_worker):
    job = JobFactory()
    assert run_worker(Chatty(), burst=True).join() == 0
    job.refresh_from_db()
    [entry] = job.execution_logs
    assert entry["command"] == ["make", "all"]
    total = sum(len(f"line {i:02d}\n") for i in range(30))
    assert entry["out"].startswith(f"[… {total - 100} earlier characters cut]\n")
    assert entry["out"].endswith("line 28\nline 29\n")
    assert entry["exit_code"] == 2


# -- Lower impact ----------------------------------------------------------------------


def test_post_handle_sees_the_state_that_was_written(run_worker):
    """The handler errors after its job was cancelled but before a heartbeat saw it: the
    row says canceled, and so does the outcome post_handle gets."""
    job = JobFactory(behavior="cancel_then_fail")
    assert run_worker(h.BehaviorHandler(heartbeat_interval=30), burst=True).join() == 0
    assert state(job) == "canceled"
    assert list(Event.objects.filter(kind__startswith="post_handle").values_list("kind")) == [
        ("post_handle:canceled",)
    ]


def test_claims_back_off_while_they_keep_failing(run_worker, caplog):
    table = QueueJob._meta.db_table
    tw = run_worker(h.BehaviorHandler(interval=0.05))
    time.sleep(0.3)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO dbworker_hidden")
    try:
        time.sleep(4)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE dbworker_hidden RENAME TO {table}")
    assert tw.stop() == 0
    pauses = [
        float(r.getMessage().split("paused for ")[1].split("s")[0])
        for r in caplog.records
        if "claims failed, paused for" in r.getMessage()
    ]
    assert len(pauses) >= 3, pauses
    assert max(pauses) >= 1.0, pauses  # 0.5 s doubling (with jitter), not starting over


@override_settings(DBWORKER={"RESET_INTERVAL": 0.2})
def test_a_failing_resetter_pass_says_so_and_holds_up_no_claim(run_worker, caplog, monkeypatch):
    """It was logged as "claims failed, paused for 29 s", and paused the claims."""
    from django_dbworker.maintenance.resetter import Resetter

    def broken(self, alias, job_models):
        raise DatabaseError("permission denied for table testapp_queuejob")

    monkeypatch.setattr(Resetter, "_run_alias", broken)
    tw = run_worker(h.BehaviorHandler(interval=0.05))
    jobs = JobFactory.create_batch(3)
    wait_until(lambda: all(state(j) == "completed" for j in jobs), 10)
    time.sleep(0.5)  # a few more passes: said once, not at each
    assert tw.stop() == 0
    said = [r for r in caplog.records if "pass failed" in r.getMessage()]
    assert [r.getMessage() for r in said] == [
        "resetter pass failed, next in 0.2s: DatabaseError: permission denied for table "
        "testapp_queuejob"
    ]
    assert not [r for r in caplog.records if "claims failed" in r.getMessage()]


@postgres_only
def test_a_worker_that_cannot_heartbeat_stops_its_jobs_before_they_are_reset(run_worker, caplog):
    caplog.set_level("INFO", logger="django_dbworker")
    job = JobFactory(behavior="sleep", payload={"seconds": 30})
    handler = h.BehaviorHandler(heartbeat_interval=0.2, stalled_max_age=3)
    tw = run_worker(handler, with_resetter=False)
    # The row says processing at the claim's commit, a moment before the attempt runs.
    [attempt] = wait_until(lambda: tw.worker.lanes[0].running(), 10, message="the attempt")
    with outage():
        wait_until(lambda: attempt.cancel_reason is not None, 10, message="the worker giving up")
        tw.worker.stop()  # drain: it must not claim the job again once it is requeued
    assert attempt.cancel_reason is CancelReason.NO_HEARTBEAT
    assert tw.join(60) == 0
    job.refresh_from_db()
    assert (job.state, job.num_failures, job.num_resets) == ("queued", 0, 0)
    assert f"job testapp.QueueJob:{job.pk}: requeued: the worker could not heartbeat" in (
        caplog.text
    )


def test_string_commands_are_split_like_a_shell_and_other_types_refused():
    from django_dbworker.runtime.attempt import as_command

    assert as_command("ls -la '/tmp/a b'") == ["ls", "-la", "/tmp/a b"]
    assert as_command(["git", b"clone"]) == ["git", "clone"]
    with pytest.raises(TypeError):
        as_command(42)


# -- A lane that holds its claims: the quarantine, and a failed row check --------------


class _Holding:
    """An executor that keeps the claimed attempts for the test instead of running them."""

    def __init__(self, run):
        self.attempts = []

    def submit(self, attempt):
        self.attempts.append(attempt)

    def start(self):
        pass

    def stop(self):
        pass

    def join(self, timeout):
        pass


def _holding_lane(worker_id):
    """A lane whose executor keeps the claimed attempts: nothing runs, nothing is written."""
    from django_dbworker.runtime.lane import Lane, LaneCallbacks

    lane = None
    callbacks = LaneCallbacks(
        submit=lambda attempt, outcome: None,
        slot_free=lambda lane: None,
        released=lambda lane: None,
        held_ids=lambda model: [],
        holds_reset_job=lambda: lane.holds_reset_job(),
        writing=lambda: True,
    )
    lane = Lane(h.BehaviorHandler(), worker_id, callbacks, executor=_Holding)
    return lane


def test_a_reset_job_is_quarantined_until_its_outcome_is_written():
    """A process runs one reset job at a time, and one that has returned counts until
    its outcome is written: a crash before that write resets it again, so a second
    reset job (the poison, say) must not start beside it."""
    from django_dbworker.sql.django_connection import DjangoConnection

    first, second = JobFactory.create_batch(2, num_resets=1)
    lane = _holding_lane("test:1:quarantine")
    conn = DjangoConnection(lane.alias)
    assert lane.claim(conn, 1) == 1
    (attempt,) = lane.executor.attempts
    attempt.finished = True  # its handler returned; the writer has not written it yet
    assert lane.claim(conn, 2) == 0
    assert QueueJob.objects.get(pk=second.pk).state == "queued"
    attempt.job.num_resets = 0  # a hook changed the field: what counts is the claimed row
    lane.release(attempt)  # written
    assert lane.claim(conn, 2) == 1
    assert {a.pk for a in lane.executor.attempts} == {first.pk, second.pk}


class _FailingOnce:
    """The real connection, except that ``statement`` fails once (a terminated backend)."""

    def __init__(self, conn, statement):
        self.conn, self.statement = conn, statement

    def execute(self, sql, params=()):
        if sql == self.statement:
            self.statement = None
            raise DatabaseError("terminating connection due to administrator command")
        return self.conn.execute(sql, params)


@row_locks_only
def test_a_log_whose_row_check_fails_is_written_later_not_dropped():
    from django_dbworker.runtime.completer import Completer
    from django_dbworker.sql.django_connection import DjangoConnection

    job = JobFactory(behavior="log")
    worker_id = "test:1:logs"
    lane = _holding_lane(worker_id)
    conn = DjangoConnection(lane.alias)
    assert lane.claim(conn, 1)
    (attempt,) = lane.executor.attempts
    attempt.log("step", ["echo", "hi"], out="hi\n")
    completer = Completer(worker_id)

    locked, release = threading.Event(), threading.Event()

    def hold_the_row():  # the handler's own transaction, its job row locked
        from django.db import connections, transaction

        try:
            with transaction.atomic():
                QueueJob.objects.select_for_update().get(pk=job.pk)
                locked.set()
                release.wait(20)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(20)
        # The log's UPDATE skips the locked row; the check that follows fails.
        with pytest.raises(DatabaseError):
            completer.write_logs(_FailingOnce(conn, lane.stmts.still_held), lane, attempt)
        assert attempt.logs_pending
    finally:
        release.set()
        holder.join(30)
    assert completer.write_logs(conn, lane, attempt) == "written"
    job.refresh_from_db()
    assert [entry["key"] for entry in job.execution_logs] == ["step"]
