"""Waiting for a job to end (issue 44, item 5): ``job.wait()``, ``await
job.await_done()``, ``result.wait()`` of ``django.tasks``. One hub per process, one
connection per database for every waiter; woken by the outcome's NOTIFY on
PostgreSQL, by polling elsewhere."""

import asyncio
import os
import threading
import time

import pytest
from django.db import connection, connections

from django_dbworker import WaitTimeout, waiting
from django_dbworker.tasks.models import TaskJob
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp import tasks as t
from tests.testapp.handlers import BehaviorHandler
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="LISTEN/NOTIFY and pg_stat_activity"
)


def run_async(coroutine_function):
    """``asyncio.run`` in a thread of its own, closing the Django connection asgiref's
    sync thread opened. Not in this thread: the browser tests' Playwright (its sync API,
    a session fixture) keeps an event loop running in the main thread of the process
    that ran them, where ``asyncio.run`` refuses to start."""
    from asgiref.sync import sync_to_async

    async def main():
        try:
            return await coroutine_function()
        finally:
            await sync_to_async(connections.close_all)()

    box = {}

    def run():
        try:
            box["result"] = asyncio.run(main())
        except BaseException as exc:  # raised again in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="test-asyncio")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def in_thread(function, *args):
    """Run ``function`` in a thread: (thread, box of its result or exception)."""
    box = {}

    def run():
        try:
            box["value"] = function(*args)
        except BaseException as exc:
            box["error"] = exc
        finally:
            connections.close_all()  # the thread's own, which refresh_from_db opened

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_a_finished_job_returns_at_once_reloaded():
    job = JobFactory(state="completed")
    stale = QueueJob.objects.get(pk=job.pk)
    QueueJob.objects.filter(pk=job.pk).update(behavior="changed")
    assert stale.wait(timeout=10) is stale
    assert stale.behavior == "changed"


def test_a_timeout_raises_a_timeout_error():
    job = JobFactory()
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=rf"QueueJob {job.pk} did not finish within 0.3s"):
        job.wait(timeout=0.3)
    assert time.monotonic() - started >= 0.3
    assert isinstance(WaitTimeout(), TimeoutError)
    assert waiting.hub().waiters() == 0  # the timed-out waiter is gone


def test_bad_timeouts_and_unsaved_jobs_are_refused():
    with pytest.raises(ValueError, match="timeout"):
        JobFactory().wait(timeout=-1)
    with pytest.raises(ValueError, match="no primary key"):
        QueueJob().wait(timeout=1)


def test_a_deleted_job_raises_does_not_exist():
    job = JobFactory()
    thread, box = in_thread(job.wait, 30)
    wait_until(lambda: waiting.hub().waiters() == 1, 10)
    QueueJob.objects.filter(pk=job.pk).delete()
    thread.join(10)
    assert isinstance(box.get("error"), QueueJob.DoesNotExist)


@pytest.mark.parametrize("state", ["completed", "failed", "canceled"])
def test_each_final_state_ends_the_wait_and_others_do_not(state):
    job = JobFactory()
    thread, box = in_thread(job.wait, 30)
    wait_until(lambda: waiting.hub().waiters() == 1, 10)
    for passing in ("processing", "errored", "queued"):
        QueueJob.objects.filter(pk=job.pk).update(state=passing)
        time.sleep(waiting.POLL * 2)
        assert thread.is_alive(), f"{passing} ended the wait"
    QueueJob.objects.filter(pk=job.pk).update(state=state)
    thread.join(10)
    assert box["value"].state == state


def test_a_worker_s_outcome_wakes_the_waiter(run_worker, monkeypatch):
    """On PostgreSQL without polling (LISTENING_POLL an hour): the NOTIFY does it."""
    monkeypatch.setattr(waiting._hub, "LISTENING_POLL", 3600.0)
    jobs = [JobFactory(behavior="sleep", payload={"seconds": 0.3}) for _ in range(3)]
    waiters = [in_thread(job.wait, 60) for job in jobs]
    wait_until(lambda: waiting.hub().waiters() == 3, 10)
    run_worker(BehaviorHandler())
    for thread, box in waiters:
        thread.join(30)
        assert box["value"].state == "completed"


def test_many_coroutines_wait_without_blocking_the_loop():
    jobs = QueueJob.objects.bulk_create([QueueJob() for _ in range(300)])

    async def main():
        waits = [asyncio.ensure_future(job.await_done(30)) for job in jobs]
        ticks = 0
        while waiting.hub().waiters() < len(jobs):
            await asyncio.sleep(0.01)
            ticks += 1
        await asyncio.sleep(0)
        from asgiref.sync import sync_to_async

        await sync_to_async(QueueJob.objects.update)(state="completed")
        return await asyncio.gather(*waits)

    done = run_async(main)
    assert [job.state for job in done] == ["completed"] * 300


def test_an_async_timeout_raises_and_leaves_no_waiter():
    job = JobFactory()

    async def main():
        with pytest.raises(WaitTimeout):
            await job.await_done(0.2)

    run_async(main)
    assert waiting.hub().waiters() == 0


@postgresql_only
def test_a_thousand_waiters_take_one_connection():
    jobs = QueueJob.objects.bulk_create([QueueJob() for _ in range(1000)])

    def sessions():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
            return cursor.fetchone()[0]

    wait_until(lambda: waiting.hub().waiters() == 0, 10)
    # The hub of an earlier test closes its connection once idle.
    wait_until(lambda: waiting.hub()._thread is None, waiting.IDLE_CLOSE + 5)
    from asgiref.sync import sync_to_async

    async def main():
        # Counted from asgiref's sync thread (the one the waiters reload in), whose
        # connection then exists before as after.
        before = await sync_to_async(sessions)()
        waits = [asyncio.ensure_future(job.await_done(60)) for job in jobs]
        while waiting.hub().waiters() < len(jobs):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # the hub's first reads are done
        during = await sync_to_async(sessions)()
        await sync_to_async(QueueJob.objects.update)(state="completed")
        await asyncio.gather(*waits)
        return before, during

    before, during = run_async(main)
    assert during - before <= 1, (before, during)
    assert during - before == 1  # the hub's (so the count sees it)


def test_a_task_result_waits():
    result = t.add.enqueue(2, 3)
    row = TaskJob.objects.get(result_id=result.id)
    thread, box = in_thread(result.wait, 30)
    wait_until(lambda: waiting.hub().waiters() == 1, 10)
    TaskJob.objects.filter(pk=row.pk).update(state="completed", return_value=5)
    thread.join(10)
    assert box["value"] is result
    assert (result.status, result.return_value) == ("SUCCESSFUL", 5)


def test_a_task_result_awaits_and_times_out():
    result = t.add.enqueue(2, 3)

    async def main():
        with pytest.raises(WaitTimeout):
            await result.await_done(0.2)

    run_async(main)
    TaskJob.objects.update(state="failed")

    async def again():
        return await result.await_done(10)

    assert run_async(again).status == "FAILED"


@pytest.mark.subprocess
def test_a_wait_survives_its_worker_killed_and_the_job_reset(spawn):
    """The first attempt blocks; its worker is killed (-9); a second worker's resetter
    puts the job back and runs it: the waiter returns with the completed job."""
    job = JobFactory(behavior="block", payload={"seconds": 60, "first_only": True})
    thread, box = in_thread(job.wait, 90)
    first = spawn("runworker", "tests.testapp.handlers.BehaviorHandler")
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "processing", 30)
    first.kill()
    time.sleep(0.5)
    assert thread.is_alive()
    second = spawn("runworker", "tests.testapp.handlers.BehaviorHandler")
    thread.join(60)
    assert box["value"].state == "completed"
    assert box["value"].num_resets == 1
    second.kill()


@pytest.fixture(autouse=True, scope="module")
def _close_the_hub():
    """Its connection must not outlive the tests' database."""
    yield
    waiting.hub().close()


@postgresql_only
def test_a_notification_s_word_is_checked_against_the_row(monkeypatch):
    """A NOTIFY that names the job as completed releases the hub's waiter, but wait()
    reloads the row: not final, it waits on (anyone may NOTIFY)."""
    monkeypatch.setattr(waiting._hub, "LISTENING_POLL", 3600.0)
    job = JobFactory()
    thread, box = in_thread(job.wait, 30)
    wait_until(lambda: waiting.hub().waiters() == 1, 10)
    time.sleep(0.3)  # the hub LISTENs
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_notify(%s, %s)",
            [waiting.CHANNEL, f"{QueueJob._meta.db_table}\t{job.pk}=c"],
        )
    wait_until(lambda: waiting.hub().waiters() == 1, 10, message="waiting again")
    assert thread.is_alive()
    QueueJob.objects.filter(pk=job.pk).update(state="completed")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [waiting.CHANNEL, QueueJob._meta.db_table])
    thread.join(10)
    assert box["value"].state == "completed"


def test_payloads_name_integer_and_uuid_keys_and_fall_back_to_the_table():
    import uuid

    from django_dbworker.waiting._link import MAX_PAYLOAD, parse, payload

    key = uuid.uuid4()
    text = payload("t", [(1, "completed"), (key, "failed"), (3, "canceled")])
    assert text == f"t\t1=c;{key}=f;3=x"
    assert parse(text) == ("t", {"1": "completed", str(key): "failed", "3": "canceled"})
    assert payload("t", [("a;b=c", "completed")]) == "t"  # text keys: the hub reads
    many = [(n, "completed") for n in range(10**6, 10**6 + 2000)]
    assert payload("t", many) == "t"
    assert len(payload("t", many[:100]).encode()) <= MAX_PAYLOAD
    assert parse("t") == ("t", None)
    assert parse("t\t1=?") == ("t", None)


@postgresql_only
def test_workers_notify_only_while_a_hub_s_session_exists(run_worker, monkeypatch):
    """No session named 'dbworker waiting': a worker ends jobs without a NOTIFY. One
    there: each round of ended jobs is told, with their keys and states."""
    import psycopg

    from django_dbworker.runtime import done
    from tests.conftest import test_database_url

    monkeypatch.setattr(done, "PROBE_EVERY", 0.0)  # look each time
    waiting.hub().close()  # an earlier test's hub: its session would count

    def listener(name):
        conn = psycopg.connect(test_database_url(), autocommit=True)
        conn.execute(f"SET application_name = '{name}'")
        conn.execute(f"LISTEN {waiting.CHANNEL}")
        return conn

    quiet = listener("someone else")
    try:
        first = JobFactory()
        tw = run_worker(BehaviorHandler())
        wait_until(lambda: QueueJob.objects.get(pk=first.pk).state == "completed", 20)
        time.sleep(0.5)
        assert list(quiet.notifies(timeout=0.2)) == []
        hub_like = listener(waiting.SESSION_NAME)
        try:
            second = JobFactory(behavior="fail", payload={})
            QueueJob.objects.filter(pk=second.pk).update(behavior="nonretryable")
            wait_until(lambda: QueueJob.objects.get(pk=second.pk).state == "failed", 20)
            notes = [n.payload for n in hub_like.notifies(timeout=5, stop_after=1)]
            assert notes == [f"{QueueJob._meta.db_table}\t{second.pk}=f"]
        finally:
            hub_like.close()
        tw.stop()
    finally:
        quiet.close()


def test_a_forked_child_gets_a_hub_of_its_own():
    parent = waiting.hub()
    pid = os.fork()
    if pid == 0:  # the child: a new hub, or exit 1
        os._exit(0 if waiting.hub() is not parent and waiting.hub().pid == os.getpid() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert waiting.hub() is parent
