"""Waiting-only unique keys (issue 42, item 14): gocraft/work's unique jobs.

``unique_job_constraint(states=["queued"])`` holds a key while the job waits, not while
it runs: a change that comes while the job runs is enqueued. Every path that brings a
job back to waiting while another job waits with its key has one rule: the waiting job
keeps the key; the one coming back is superseded (``canceled``, its failure message
naming the job that holds the key), or, for the operator's retry, left as it is
(``held``). Never a failing statement for the other jobs, never a job left running.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.urls import reverse
from django.utils import timezone

from django_dbworker import operations
from django_dbworker.control import unique
from django_dbworker.maintenance.resetter import Resetter
from django_dbworker.sql import superseding
from django_dbworker.sql.connection import Connection, DjangoConnection
from django_dbworker.sql.jobs import statements_for
from tests.conftest import wait_until
from tests.testapp import handlers as h
from tests.testapp.models import Event, WaitingKeyJob

pytestmark = pytest.mark.django_db(transaction=True)

HANDLER = "tests.testapp.handlers.WaitingKeyHandler"
LATER = timedelta(hours=1)


def state(job):
    return WaitingKeyJob.objects.get(pk=job.pk).state


def started(job):
    return Event.objects.filter(job_id=job.pk, kind="start").exists()


def superseded(job, holder, constraint):
    job = WaitingKeyJob.objects.get(pk=job.pk)
    assert job.state == "canceled", (job.state, job.failure_message)
    expected = f"superseded by job {holder.pk}, which waits with the same unique key ({constraint})"
    assert job.failure_message.startswith(expected), job.failure_message
    assert job.history[-1]["outcome"] == "canceled"
    assert job.history[-1]["message"].startswith(expected)
    return job


def stalled(**fields):
    """A job a worker that died held (its heartbeat long gone)."""
    old = timezone.now() - timedelta(minutes=10)
    fields.setdefault("worker_hostname", "gone:1:aaaaaa")
    return WaitingKeyJob.objects.create(
        state="processing",
        started_at=old,
        last_heartbeat_at=old,
        **fields,
    )


@pytest.fixture
def db():
    conn = Connection("default", "waiting-keys")
    yield conn
    conn.close()


@pytest.fixture
def sql():
    return statements_for(WaitingKeyJob, connection.vendor, "default")


# -- enqueueing ------------------------------------------------------------------------


def test_a_change_that_comes_while_the_job_runs_is_enqueued(db, sql):
    """gocraft: "when the job is processed, we'll delete that key to permit another job
    to be enqueued". An active key (``tenant``) keeps refusing it."""
    first, created = WaitingKeyJob.objects.enqueue_unique(name="cache", tenant="t")
    assert created
    again, created = WaitingKeyJob.objects.enqueue_unique(name="cache")
    assert (again.pk, created) == (first.pk, False), "waiting: one job per key"
    WaitingKeyJob.objects.filter(pk=first.pk).update(state="processing")
    change, created = WaitingKeyJob.objects.enqueue_unique(name="cache")
    assert created, "running: the key is free"
    assert change.pk != first.pk
    held, created = WaitingKeyJob.objects.enqueue_unique(tenant="t")
    assert (held.pk, created) == (first.pk, False), "an active key is held while running"


def test_replace_writes_to_the_waiting_holder_and_enqueues_once_a_worker_took_it(monkeypatch):
    """``on_conflict="replace"`` writes to the job that holds the key while it waits;
    when a worker takes it between the lookup and the write, its waiting-only key is
    free: the change is enqueued as a new job, not dropped."""
    holder, _ = WaitingKeyJob.objects.enqueue_unique(name="cache", payload={"v": 1})
    job, created = WaitingKeyJob.objects.enqueue_unique(
        name="cache", payload={"v": 2}, on_conflict="replace"
    )
    assert (job.pk, created, job.payload) == (holder.pk, False, {"v": 2})

    looked_up = unique._holder

    def claimed_meanwhile(manager, constraints, job):
        found = looked_up(manager, constraints, job)
        if found is not None:
            WaitingKeyJob.objects.filter(pk=found.pk).update(state="processing")
        return found

    monkeypatch.setattr(unique, "_holder", claimed_meanwhile)
    job, created = WaitingKeyJob.objects.enqueue_unique(
        name="cache", payload={"v": 3}, on_conflict="replace"
    )
    assert created
    assert (job.pk != holder.pk, job.payload) == (True, {"v": 3})
    assert WaitingKeyJob.objects.get(pk=holder.pk).payload == {"v": 2}


def test_replace_never_takes_a_key_another_job_holds():
    """Replace writes the other fields, those of another constraint too: taking an
    active key another job holds raises, naming it, and writes nothing (as for
    active keys)."""
    other = WaitingKeyJob.objects.create(tenant="t2")
    holder, _ = WaitingKeyJob.objects.enqueue_unique(name="cache", tenant="t1")
    with pytest.raises(IntegrityError, match=f"testapp_waitkey_active, which job {other.pk}"):
        WaitingKeyJob.objects.enqueue_unique(name="cache", tenant="t2", on_conflict="replace")
    assert WaitingKeyJob.objects.get(pk=holder.pk).tenant == "t1"


# -- the resetter ----------------------------------------------------------------------


def test_a_stalled_job_whose_key_a_waiting_job_holds_is_superseded_by_it(caplog):
    """Before: the resetter's statement failed on the key, for every stalled job of the
    table, pass after pass. Now the returning job is superseded, the others reset; of
    two stalled jobs of one key and none waiting, the first keeps the key."""
    returning = stalled(name="cache")
    waiting = WaitingKeyJob.objects.create(name="cache")
    other = stalled(name="other")
    twin_a, twin_b = stalled(target="t"), stalled(target="t")
    resetter = Resetter([h.WaitingKeyHandler()])
    try:
        [report] = resetter.run_once()
    finally:
        resetter.close()
    superseded(returning, waiting, "testapp_waitkey_queued")
    superseded(twin_b, twin_a, "testapp_waitkey_waiting")
    assert (state(waiting), state(other), state(twin_a)) == ("queued", "queued", "queued")
    assert sorted(report.reset) == sorted([other.pk, twin_a.pk])
    assert sorted(report.superseded) == sorted([returning.pk, twin_b.pk])
    assert WaitingKeyJob.objects.get(pk=returning.pk).num_resets == 0
    lines = [r.getMessage() for r in caplog.records if "canceled: no heartbeat" in r.getMessage()]
    assert any(f"superseded by job {waiting.pk}" in line for line in lines), lines


# -- the worker's own paths ------------------------------------------------------------


def test_a_retry_after_an_error_is_superseded_by_the_change_that_waits(run_worker):
    """processing → errored (a retry in a minute), while a change of the job waits
    with its ``target`` (held while queued or errored): the erroring job is superseded,
    with its error in the message; a job erroring beside it without a change is errored
    as ever. With a key held while queued only (``name``), errored holds nothing: both
    stay."""
    by_target = WaitingKeyJob.objects.create(target="t", behavior="raise_when_changed")
    by_name = WaitingKeyJob.objects.create(name="n", behavior="raise_when_changed")
    plain = WaitingKeyJob.objects.create(target="u", behavior="fail")
    tw = run_worker(h.WaitingKeyHandler())
    wait_until(lambda: started(by_target), message="the first job to start")
    change = WaitingKeyJob.objects.create(target="t", process_after=timezone.now() + LATER)
    wait_until(lambda: state(by_target) != "processing", message="the first job to end")
    wait_until(lambda: started(by_name), message="the second job to start")
    name_change = WaitingKeyJob.objects.create(name="n", process_after=timezone.now() + LATER)
    wait_until(lambda: state(by_name) != "processing" and state(plain) != "queued")
    wait_until(lambda: state(plain) != "processing")
    assert tw.stop() == 0
    job = superseded(by_target, change, "testapp_waitkey_waiting")
    assert "stale input" in job.failure_message
    assert job.num_failures == 0
    assert (state(by_name), state(plain)) == ("errored", "errored")
    assert (state(change), state(name_change)) == ("queued", "queued")


def test_a_job_requeued_at_shutdown_is_superseded_by_the_change_that_waits(run_worker):
    """The drain gives a running job back unrun while its change waits: superseded; a
    job without a change is requeued as ever."""
    job = WaitingKeyJob.objects.create(name="cache", behavior="sleep", payload={"seconds": 60})
    tw = run_worker(h.WaitingKeyHandler(num_handlers=2), shutdown_timeout=0.2)
    other = WaitingKeyJob.objects.create(name="other", behavior="sleep", payload={"seconds": 60})
    wait_until(lambda: started(job) and started(other), message="both jobs to start")
    change = WaitingKeyJob.objects.create(name="cache", process_after=timezone.now() + LATER)
    assert tw.stop() == 0
    superseded(job, change, "testapp_waitkey_queued")
    assert (state(other), state(change)) == ("queued", "queued")


def test_requeues_of_one_key_together_keep_one_job(db, sql):
    """The worker gives back several jobs at once (a claim's lost reply, a drain): of
    two with one key, the first is requeued and the second superseded by it; a job
    held by a waiting one is superseded; a job of another worker is left alone."""
    worker = "me:1:aaaaaa"
    a, b = (stalled(name="k", worker_hostname=worker) for _ in range(2))
    held = stalled(target="t", worker_hostname=worker)
    holder = WaitingKeyJob.objects.create(target="t")
    theirs = stalled(name="k")
    states = superseding.requeue(db, sql, [a.pk, b.pk, held.pk, theirs.pk], worker, "drain")
    assert states == {a.pk: "queued", b.pk: "canceled", held.pk: "canceled"}
    superseded(b, a, "testapp_waitkey_queued")
    superseded(held, holder, "testapp_waitkey_waiting")
    assert state(theirs) == "processing"
    # A claim whose reply was lost: the rows no lane holds.
    c = stalled(name="k2", worker_hostname=worker)
    d = stalled(name="k", worker_hostname=worker)
    states = superseding.requeue_unheld(db, sql, worker, [], "lost reply")
    assert states == {c.pk: "queued", d.pk: "canceled"}
    superseded(d, a, "testapp_waitkey_queued")


# -- the operator ----------------------------------------------------------------------


def test_the_operators_retry_of_a_job_whose_key_a_waiting_job_holds_reports_it_held():
    """The operator's retry never supersedes: the job stays as it is, in ``held`` with
    its holder (the admin says so); the others are retried. An errored job retried
    holds its own ``target`` already."""
    failed = WaitingKeyJob.objects.create(name="cache", state="failed")
    errored = WaitingKeyJob.objects.create(name="other", target="t", state="errored")
    holder = WaitingKeyJob.objects.create(name="cache")
    free = WaitingKeyJob.objects.create(name="free", state="canceled")
    result = operations.retry(WaitingKeyJob.objects.filter(pk__in=[failed.pk, errored.pk, free.pk]))
    assert result.held == {failed.pk: holder.pk}
    assert sorted(result.retried) == sorted([errored.pk, free.pk])
    assert (state(failed), state(errored), state(free)) == ("failed", "queued", "queued")


def test_run_now_of_a_job_beside_the_holder_of_its_key_moves_no_key():
    """Run-now changes a waiting job's time, not its state: an errored job due later,
    whose ``name`` (held while queued only) a queued job holds, becomes due."""
    WaitingKeyJob.objects.create(name="cache")
    errored = WaitingKeyJob.objects.create(
        name="cache", state="errored", process_after=timezone.now() + LATER
    )
    assert operations.run_now(WaitingKeyJob.objects.filter(pk=errored.pk)) == [errored.pk]
    errored.refresh_from_db()
    assert (errored.state, errored.process_after) == ("errored", None)


def test_the_admin_shows_a_superseded_job_and_its_retry_held(admin_client):
    """The job page says why the job ended; its retry (the list's action) is held while
    the job that superseded it waits, and goes through once that one ran."""
    returning = stalled(name="cache")
    waiting = WaitingKeyJob.objects.create(name="cache")
    resetter = Resetter([h.WaitingKeyHandler()])
    try:
        resetter.run_once()
    finally:
        resetter.close()
    page = admin_client.get(reverse("admin:testapp_waitingkeyjob_change", args=[returning.pk]))
    assert f"superseded by job {waiting.pk}, which waits" in page.content.decode()
    data = {"action": "retry_jobs", "_selected_action": [returning.pk], "index": 0}
    url = reverse("admin:testapp_waitingkeyjob_changelist")
    response = admin_client.post(url, data, follow=True)
    messages = " ".join(str(m) for m in response.context["messages"])
    assert f"job {returning.pk} (its unique key is held by job {waiting.pk})" in messages
    assert state(returning) == "canceled"
    WaitingKeyJob.objects.filter(pk=waiting.pk).update(state="processing")
    admin_client.post(url, data, follow=True)
    assert state(returning) == "queued"


# -- a real runworker ------------------------------------------------------------------


@pytest.mark.subprocess
def test_sigterm_requeue_of_a_job_whose_change_waits_supersedes_it(spawn):
    """runworker drains at SIGTERM and gives the running job back past its shutdown
    timeout while a change of it waits: the job ends superseded, the change waits,
    and the worker exits cleanly."""
    job = WaitingKeyJob.objects.create(name="cache", behavior="sleep", payload={"seconds": 60})
    worker = spawn("runworker", HANDLER, "--no-resetter", "--shutdown-timeout", "0.5")
    try:
        wait_until(lambda: started(job), message="the job to start")
        change = WaitingKeyJob.objects.create(name="cache", process_after=timezone.now() + LATER)
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output
    finally:
        worker.kill()
    superseded(job, change, "testapp_waitkey_queued")
    assert state(change) == "queued"
    assert "SIGTERM received, draining" in worker.output


@pytest.mark.skipif(connection.vendor == "sqlite", reason="one writer at a time there")
def test_an_insert_of_the_key_that_commits_while_the_requeue_waits_supersedes_it(db, sql):
    """Race: the requeue's guard runs before another transaction's insert of the key
    commits; the statement waits for that transaction on the unique index, then fails
    on the key (PostgreSQL) or sees it (MariaDB): the job is superseded, the other job
    of the same statement requeued."""
    worker = "me:1:aaaaaa"
    job = stalled(name="k", worker_hostname=worker)
    beside = stalled(name="other", worker_hostname=worker)
    inserted, release = threading.Event(), threading.Event()
    change = []

    def insert():
        try:
            with transaction.atomic():
                change.append(WaitingKeyJob.objects.create(name="k"))
                inserted.set()
                release.wait(30)
        finally:
            connections.close_all()

    inserter = threading.Thread(target=insert)
    inserter.start()
    assert inserted.wait(30)
    result = {}
    requeue = threading.Thread(
        target=lambda: result.update(
            superseding.requeue(db, sql, [job.pk, beside.pk], worker, "drain")
        )
    )
    requeue.start()
    time.sleep(0.5)  # the requeue waits on the uncommitted key
    release.set()
    inserter.join(30)
    requeue.join(30)
    assert result == {job.pk: "canceled", beside.pk: "queued"}
    superseded(job, change[0], "testapp_waitkey_queued")


@pytest.mark.django_db(transaction=False)
def test_inside_the_callers_transaction_a_failed_row_undoes_only_itself(sql):
    """The testing helpers run the statements on Django's connection, inside the test's
    transaction: the statement that fails on the key runs in a savepoint, so the
    transaction goes on (PostgreSQL would refuse every later statement)."""
    worker = "me:1:aaaaaa"
    a, b = (stalled(name="k", worker_hostname=worker) for _ in range(2))
    with transaction.atomic():
        states = superseding.requeue(DjangoConnection("default"), sql, [a.pk, b.pk], worker, "x")
        assert states == {a.pk: "queued", b.pk: "canceled"}
        assert WaitingKeyJob.objects.filter(name="k", state="queued").count() == 1


def test_a_superseding_whose_reply_was_lost_counts_as_written(run_worker, caplog):
    """The superseding committed, then the connection broke before its reply: the
    writer's next try finds the row canceled by this worker, superseded, and counts
    it written (not "refused")."""
    from django.db import OperationalError

    tw = run_worker(h.WaitingKeyHandler(), install_signal_handlers=False)
    completer = tw.worker.writer.completer
    write, lost = completer.write, []

    def write_losing_its_first_reply(conn, lane, kind, items):
        said = [outcome.message for _, outcome in items]
        written = write(conn, lane, kind, items)
        if written.states and not lost:
            lost.append(dict(written.states))
            for (_, outcome), message in zip(items, said, strict=True):
                outcome.message = message  # the reply (naming the holder) never came
            conn.lost = True  # as a broken connection leaves it
            raise OperationalError("server closed the connection unexpectedly")
        return written

    completer.write = write_losing_its_first_reply
    job = WaitingKeyJob.objects.create(target="t", behavior="raise_when_changed")
    wait_until(lambda: started(job), message="the job to start")
    change = WaitingKeyJob.objects.create(target="t", process_after=timezone.now() + LATER)
    with caplog.at_level(logging.INFO, "django_dbworker"):
        wait_until(lambda: sum(tw.worker.writer.counts.values()) == 1, 20)
    assert lost == [{job.pk: "canceled"}]
    assert dict(tw.worker.writer.counts) == {"canceled": 1}
    assert "refused" not in caplog.text
    superseded(job, change, "testapp_waitkey_waiting")


def test_under_concurrent_enqueues_and_errors_no_outcome_fails_and_no_job_is_left_running(
    run_worker, caplog
):
    """Three threads enqueue changes of one key as fast as they can while a worker's
    jobs of that key error and are retried at once (a key held while queued or
    errored): errors meet waiting changes all the time. No outcome's statement fails,
    the key is never held twice, and once the worker stops no job runs."""
    stop = threading.Event()
    made = []

    def enqueue():
        try:
            while not stop.is_set():
                job, created = WaitingKeyJob.objects.enqueue_unique(
                    target="k", behavior="fail", on_conflict="skip"
                )
                if created:
                    made.append(job.pk)
        finally:
            connections.close_all()

    handler = h.WaitingKeyHandler(num_handlers=2, retry_after=0, max_num_retries=50)
    with caplog.at_level(logging.INFO, "django_dbworker"):
        tw = run_worker(handler)
        threads = [threading.Thread(target=enqueue) for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            wait_until(
                lambda: WaitingKeyJob.objects.filter(state="canceled").count() >= 20,
                30,
                message="jobs superseded",
            )
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert tw.stop() == 0
    assert "could not write" not in caplog.text
    assert "giving up" not in caplog.text
    states = dict(WaitingKeyJob.objects.values_list("pk", "state"))
    assert "processing" not in states.values()
    waiting = [pk for pk, s in states.items() if s in ("queued", "errored")]
    assert len(waiting) <= 1, waiting
    canceled = WaitingKeyJob.objects.filter(state="canceled")
    for job in canceled:
        assert job.failure_message.startswith("superseded by job "), job.failure_message
    print(f"\n{connection.vendor}: {len(made)} made, {canceled.count()} superseded")


def test_a_unique_constraint_written_by_hand_in_states_the_engine_cannot_keep_is_an_error():
    """``unique_job_constraint`` refuses such states; a ``models.UniqueConstraint``
    written by hand gets ``dbworker.E016``. The test app's keys (active, waiting-only,
    every state) pass."""
    from types import SimpleNamespace

    from django.db import models

    from django_dbworker.checks import check_job_models
    from django_dbworker.control.checks import unique_key_problems

    def constraint(states, name):
        return models.UniqueConstraint(
            fields=["name"], condition=models.Q(state__in=states), name=name
        )

    meta = SimpleNamespace(
        label="testapp.Handmade",
        constraints=[
            constraint(["processing"], "running_only"),
            constraint(["queued", "processing"], "no_errored"),
            constraint(["queued"], "waiting_only"),
            constraint(["queued", "processing", "errored"], "active"),
        ],
    )
    errors = list(unique_key_problems(SimpleNamespace(_meta=meta)))
    assert [e.id for e in errors] == ["dbworker.E016", "dbworker.E016"]
    assert "'running_only' holds its key in processing" in errors[0].msg
    assert "'no_errored'" in errors[1].msg
    assert not [m for m in check_job_models() if m.id == "dbworker.E016"]


def test_a_periodic_tick_is_held_while_the_last_one_waits_and_enqueued_while_it_runs(caplog):
    """``if_held="skip"`` with a waiting-only key: a tick is skipped while the last
    tick's job waits, and enqueued while it runs (it runs after it)."""
    import datetime

    from django_dbworker import Periodic
    from django_dbworker.maintenance.scheduler import Scheduler

    def at(seconds):
        start = datetime.datetime(2026, 11, 23, 10, 0, 0, tzinfo=datetime.UTC)
        return start + datetime.timedelta(seconds=seconds)

    class Clears(h.WaitingKeyHandler):
        schedules = [Periodic("* * * * * *", fields={"name": "cache"}, name="clears")]

    scheduler = Scheduler([Clears()])
    scheduler._pass(at(0.5))
    scheduler._pass(at(1.1))
    [first] = WaitingKeyJob.objects.all()
    scheduler._pass(at(2.1))  # the first waits: skipped
    assert WaitingKeyJob.objects.count() == 1
    WaitingKeyJob.objects.filter(pk=first.pk).update(state="processing")
    scheduler._pass(at(3.1))  # the first runs: enqueued
    assert sorted(WaitingKeyJob.objects.values_list("state", flat=True)) == [
        "processing",
        "queued",
    ]


def test_unique_tasks_keep_their_active_key():
    """``@task(unique=…)``: ``TaskJob``'s key is held while a run is queued, running or
    awaiting its retry (the tasks app's migration), so a task run is never superseded
    and the task statements carry no guard."""
    from django_dbworker.sql.waiting import waiting_states
    from django_dbworker.tasks.models import TaskJob

    [key] = [c for c in TaskJob._meta.constraints if c.name == "dbworker_task_unique_active"]
    assert waiting_states(key) is None
    assert not statements_for(TaskJob, connection.vendor, "default").waiting
