"""Conformance: the documented ``django.tasks`` API and its signals, on this backend.

Run on SQLite and PostgreSQL, on each Django version of CI (Django 5.2 through the
``django-tasks`` backport). Most tests run the tasks with the testing helpers, in
the test's transaction; the last ones run a real worker.
"""

import json
import uuid
from datetime import datetime, timedelta

import django
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dbworker.maintenance.retention import Retention
from django_dbworker.states import JobState
from django_dbworker.tasks import DatabaseTask, compat
from django_dbworker.tasks import task as dbworker_task
from django_dbworker.tasks.handler import task_handlers
from django_dbworker.tasks.models import TaskJob
from django_dbworker.testing import assert_enqueued, enqueued, run_tasks
from tests.conftest import server_connection, wait_until
from tests.projects import old_package, project  # noqa: F401 - the fixture
from tests.testapp import tasks as t
from tests.testapp.models import Event

tasks = compat.require()
TaskResultStatus = compat.TaskResultStatus
InvalidTask = compat.InvalidTask
TaskResultDoesNotExist = compat.TaskResultDoesNotExist
TaskResultMismatch = compat.TaskResultMismatch
signals = compat.signals

pytestmark = pytest.mark.django_db


def row(result):
    """The ``TaskJob`` of a ``TaskResult``."""
    return TaskJob.objects.get(result_id=result.id)


def pks(*results):
    return [row(result).pk for result in results]


# -- enqueueing ----------------------------------------------------------------------


def test_enqueue_returns_a_ready_result_with_everything_known_so_far():
    before = timezone.now()
    result = t.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert result.id == TaskJob.objects.get().result_id.hex
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 3}, "default")
    assert result.enqueued_at >= before - timedelta(seconds=1)
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    assert result.task.module_path == "tests.testapp.tasks.add"


@pytest.mark.parametrize("slots", [True, False], ids=["slot-setters", "constructor"])
def test_results_are_what_the_constructor_makes(slots, monkeypatch):
    """result_of builds TaskResult without its __post_init__ (through its slots): the
    same object; the constructor where TaskResult is not what the setters expect."""
    from django_dbworker.tasks import results

    assert results._SETTERS, "TaskResult's fields changed: the fast path is off"
    if not slots:
        monkeypatch.setattr(results, "_SETTERS", ())

    values = {
        "task": t.add,
        "id": "7",
        "status": TaskResultStatus.SUCCESSFUL,
        "enqueued_at": timezone.now(),
        "started_at": timezone.now(),
        "finished_at": timezone.now(),
        "last_attempted_at": timezone.now(),
        "args": [1, [2, 3], {"a": None}],
        "kwargs": {"b": 2.5, "c": "x"},
        "backend": "default",
        "errors": [compat.TaskError(exception_class_path="builtins.KeyError", traceback="tb")],
        "worker_ids": ["w1", "w2"],
    }
    expected = results.DatabaseTaskResult(**values)  # Django's, with wait()
    object.__setattr__(expected, "_return_value", 12)  # as a finished task's
    built = results._new_result(*(values[name] for name in results._FIELDS[:-1]), 12)
    assert built == expected
    assert isinstance(built, compat.TaskResult)
    assert built.return_value == 12


def test_aenqueue_and_aget_result():
    result = async_to_sync(t.add.aenqueue)(1, 1)
    fetched = async_to_sync(t.add.aget_result)(result.id)
    assert (fetched.id, fetched.status, fetched.args) == (result.id, TaskResultStatus.READY, [1, 1])


def test_using_sets_priority_queue_run_after_and_backend():
    later = timezone.now() + timedelta(hours=1)
    task = t.add.using(priority=50, queue_name="emails", run_after=later, backend="default")
    result = task.enqueue(1, 2)
    job = row(result)
    assert (job.priority, job.queue_name, job.run_after, job.process_after) == (
        50,
        "emails",
        later,
        later,
    )
    assert result.task.priority == 50
    assert result.task.run_after == later
    assert run_tasks().attempts == 0  # not before its time
    assert row(result).state == JobState.QUEUED


def test_higher_priority_runs_first():
    for tag, priority in [("low", -5), ("high", 90), ("middle", 0), ("higher", 95)]:
        t.record_order.using(priority=priority).enqueue(tag)
    run_tasks()
    order = list(Event.objects.order_by("id").values_list("kind", flat=True))
    assert order == ["order:higher", "order:high", "order:middle", "order:low"]


def test_supports_everything_it_says():
    backend = tasks.task_backends["default"]
    assert backend.supports_defer
    assert backend.supports_priority
    assert backend.supports_get_result
    assert backend.supports_async_task


# -- results -------------------------------------------------------------------------


def test_a_successful_task_has_its_return_value_times_and_worker():
    result = t.add.enqueue(2, 3)
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.started_at is not None
    assert result.finished_at >= result.started_at
    assert result.last_attempted_at == result.started_at
    assert len(result.worker_ids) == result.attempts == 1
    assert result.errors == []


def test_arefresh():
    result = t.add.enqueue(1, 2)
    run_tasks()
    async_to_sync(result.arefresh)()
    assert result.return_value == 3


def test_a_failed_task_has_each_error_with_its_class_and_traceback():
    result = t.always_fails.enqueue()
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.KeyError"
    assert error.exception_class is KeyError
    assert "Traceback" in error.traceback
    assert "always" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


def test_retries_per_task_keep_every_attempts_error():
    result = t.flaky.enqueue("k", 2)  # fails twice, max_retries=2, retry_after=0
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 2
    assert result.attempts == 3


def test_retries_run_out():
    result = t.flaky.enqueue("never", 5)
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3  # the first, and max_retries=2 more


def test_non_retryable_error_fails_at_once():
    result = t.refuses.enqueue()
    run_tasks()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    assert result.errors[0].exception_class_path == "django_dbworker.exceptions.NonRetryableError"


def test_the_task_sees_itself_running():
    result = t.own_status.enqueue()
    run_tasks()
    result.refresh()
    assert result.return_value == {"status": "RUNNING", "workers": 1}


def test_takes_context():
    result = t.with_context.enqueue(7)
    run_tasks()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "value": 7}


def test_async_tasks_run_natively():
    result = t.async_add.enqueue(1, 2)
    run_tasks()
    result.refresh()
    assert result.return_value == {"sum": 3, "events": 0}


def test_a_return_value_that_is_not_json_fails_the_task_saying_why():
    result = t.returns_a_set.enqueue()
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    message = result.errors[0].traceback
    assert "task tests.testapp.tasks.returns_a_set returned a builtins.set" in message
    assert "not JSON-serialisable" in message


def test_arguments_are_checked_at_enqueue_time():
    with pytest.raises(TypeError, match=r"arguments of task tests\.testapp\.tasks\.add"):
        t.add.enqueue(object(), 1)
    assert not TaskJob.objects.exists()


def test_unique_keys_longer_than_their_column_never_collide():
    """Issue 42, item 8: keys were cut at 255 characters, so two users' searches that
    share a long query were one run: the second got the first's result (its arguments,
    then its return value)."""
    query = "q" * 300
    alice = t.search.enqueue(query, "alice")
    bob = t.search.enqueue(query, "bob")
    assert bob.id != alice.id
    assert bob.args == [query, "bob"]
    assert t.search.enqueue(query, "alice").id == alice.id  # still unique per key
    keys = list(TaskJob.objects.values_list("unique_key", flat=True))
    assert len(set(keys)) == 2
    assert all(len(key) <= 255 and "…sha256:" in key for key in keys)
    run_tasks()
    assert t.search.get_result(bob.id).return_value == {"user": "bob"}
    # A key that fits is kept as it is; one that looks like a digested key is digested.
    short = t.search.enqueue("cats", "carol")
    assert TaskJob.objects.get(result_id=short.id).unique_key == (
        "tests.testapp.tasks.search:search:cats:carol"
    )
    mimic = t.search.enqueue("…sha256:", "dave")
    assert TaskJob.objects.get(result_id=mimic.id).unique_key.count("…sha256:") == 2


def test_get_result_errors():
    with pytest.raises(TaskResultDoesNotExist):
        t.add.get_result("123456")
    with pytest.raises(TaskResultDoesNotExist):
        t.add.get_result("not-a-number")
    other = t.always_fails.enqueue()
    with pytest.raises(TaskResultMismatch):
        t.add.get_result(other.id)


# -- validation ----------------------------------------------------------------------


def test_validate_task_refuses_what_cannot_work():
    def local():
        return None

    with pytest.raises(InvalidTask, match="module level"):
        tasks.task(local)
    with pytest.raises(InvalidTask, match="Queue 'nowhere'"):
        t.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="max_retries"):
        dbworker_task(max_retries=-1)(t.add.func)
    with pytest.raises(InvalidTask, match="retry_backoff"):
        dbworker_task(retry_backoff=0.5)(t.add.func)
    with pytest.raises(InvalidTask, match="max_runtime"):
        t.add.using(max_runtime=-1)


# -- signals -------------------------------------------------------------------------


@pytest.fixture
def sent():
    seen = []
    finished = {}

    def receiver(signal_name):
        def receive(sender, task_result, **kwargs):
            seen.append((signal_name, task_result.id, str(task_result.status)))
            if signal_name == "finished":  # what a receiver reads of the result there
                finished[task_result.id] = (
                    task_result.return_value if task_result.status == "SUCCESSFUL" else None,
                    [e.exception_class_path for e in task_result.errors],
                    task_result.finished_at is not None,
                )

        return receive

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    signals.task_enqueued.connect(receivers["enqueued"])
    signals.task_started.connect(receivers["started"])
    signals.task_finished.connect(receivers["finished"])
    yield seen, finished
    signals.task_enqueued.disconnect(receivers["enqueued"])
    signals.task_started.disconnect(receivers["started"])
    signals.task_finished.disconnect(receivers["finished"])


def test_signals_in_order_with_their_results(sent):
    sent, finished = sent
    ok = t.add.enqueue(1, 1)
    bad = t.always_fails.enqueue()
    flaky = t.flaky.enqueue("s", 1)
    asynchronous = t.async_add.enqueue(1, 1)
    run_tasks()
    by_task = {r.id: [(s, status) for s, pk, status in sent if pk == r.id] for r in (ok, bad)}
    assert by_task[ok.id] == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]
    assert by_task[bad.id] == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("finished", "FAILED"),
    ]
    retried = [(s, status) for s, pk, status in sent if pk == flaky.id]
    assert retried == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("started", "RUNNING"),  # retried: finished only once, when it has
        ("finished", "SUCCESSFUL"),
    ]
    assert ("finished", asynchronous.id, "SUCCESSFUL") in sent
    assert finished[ok.id] == (2, [], True)
    assert finished[flaky.id] == (2, ["builtins.ValueError"], True)  # the first attempt's
    assert finished[bad.id] == (None, ["builtins.KeyError"], True)


def test_signals_are_sent_by_the_backend_class():
    """A receiver connected for this backend's class hears all three signals."""
    from django_dbworker.tasks import DatabaseBackend

    heard = []

    def receive(sender, task_result, **kwargs):
        heard.append(str(task_result.status))

    for signal in (signals.task_enqueued, signals.task_started, signals.task_finished):
        signal.connect(receive, sender=DatabaseBackend)
    try:
        t.add.enqueue(1, 1)
        run_tasks()
    finally:
        for signal in (signals.task_enqueued, signals.task_started, signals.task_finished):
            signal.disconnect(receive, sender=DatabaseBackend)
    assert heard == ["READY", "RUNNING", "SUCCESSFUL"]


def test_a_failed_tasks_log_record_carries_its_traceback(caplog):
    """Django (and the backport) log task_finished of a failure at ERROR with
    sys.exc_info(): the signal is sent in an exception handler, as their backends do."""
    name = signals.logger.name  # "django.tasks"; the backport's "django_tasks"
    result = t.always_fails.enqueue()
    with caplog.at_level("INFO", logger=name):
        run_tasks()
    [record] = [r for r in caplog.records if r.name == name and r.levelname == "ERROR"]
    assert result.id in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[0] is KeyError


# -- transactions --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueueing_is_part_of_the_callers_transaction():
    def enqueue_then_fail():
        with transaction.atomic():
            t.add.enqueue(1, 2)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not TaskJob.objects.exists()
    with transaction.atomic():
        t.add.enqueue(1, 2)
    assert TaskJob.objects.count() == 1


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.django_db(transaction=True)
def test_workers_wake_at_commit_not_before():
    listener = server_connection()  # LISTEN needs a session: past any pooler
    try:
        listener.execute("LISTEN dbworker")
        with transaction.atomic():
            t.add.enqueue(1, 2)
            assert list(listener.notifies(timeout=0.3)) == []
        [note] = list(listener.notifies(timeout=2, stop_after=1))
        assert note.payload == TaskJob._meta.db_table
    finally:
        listener.close()


def test_enqueue_is_one_insert_and_a_notify(django_assert_max_num_queries):
    with django_assert_max_num_queries(2):
        t.add.enqueue(1, 2)


# -- retention and the admin ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_finished_results_are_pruned_after_the_retention():
    old = t.add.enqueue(1, 1)
    recent = t.add.enqueue(1, 2)
    waiting = t.add.enqueue(1, 3)
    run_tasks()
    TaskJob.objects.filter(pk__in=pks(old, waiting)).update(
        finished_at=timezone.now() - timedelta(days=30)
    )
    TaskJob.objects.filter(pk__in=pks(waiting)).update(state=JobState.QUEUED)
    retention = Retention(task_handlers())
    try:
        deleted = retention.run_once()
    finally:
        retention.close()
    assert sum(deleted.values()) == 1
    assert set(TaskJob.objects.values_list("pk", flat=True)) == set(pks(recent, waiting))


def test_the_admin_shows_task_results(admin_client):
    script = "<script>alert(1)</script>"
    ok = t.add.enqueue(script, "!")
    bad = t.always_fails.enqueue()
    run_tasks()
    changelist = admin_client.get(reverse("admin:dbworker_tasks_taskjob_changelist"))
    assert changelist.status_code == 200
    assert b"tests.testapp.tasks.add" in changelist.content
    page = admin_client.get(reverse("admin:dbworker_tasks_taskjob_change", args=pks(ok)))
    body = page.content.decode()
    assert "&lt;script&gt;" in body
    assert script not in body
    failed = admin_client.get(reverse("admin:dbworker_tasks_taskjob_change", args=pks(bad)))
    assert b"attempt 1: builtins.KeyError" in failed.content


def test_assert_enqueued_and_enqueued():
    t.add.enqueue(1, 2)
    t.send_welcome.enqueue(5)
    assert len(enqueued(t.add)) == 1
    assert_enqueued(t.send_welcome, count=1, queue_name="emails")
    with pytest.raises(AssertionError, match="expected 2 enqueued"):
        assert_enqueued(t.add, count=2)


# -- a real worker -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_tasks_with_the_engines_guarantees(run_worker):
    done = [t.add.enqueue(i, i) for i in range(20)]
    nothing = [t.noop.enqueue() for _ in range(5)]  # written in the same groups
    email = t.send_welcome.enqueue(7)
    overrun = t.overruns.enqueue(30)
    long = t.cooperative_sleep.enqueue(30)
    tw = run_worker(task_handlers(), with_resetter=True)
    wait_until(lambda: row(long).state == "processing", 15)
    TaskJob.objects.filter(pk__in=pks(long)).update(cancel=True)  # what the admin's cancel does
    wait_until(lambda: not TaskJob.objects.filter(state__in=["queued", "processing"]).exists(), 30)
    assert tw.stop() == 0
    for result in [*done, email]:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert [r.return_value for r in done] == [2 * i for i in range(20)]
    for result in nothing:
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, None)
    # None is stored as the ORM stores it (SQL NULL); other values as JSON.
    ids = pks(*nothing)
    assert TaskJob.objects.filter(pk__in=ids, return_value__isnull=True).count() == 5
    assert not TaskJob.objects.filter(pk__in=pks(*done), return_value__isnull=True)
    assert Event.objects.filter(kind="welcome", job_id=7).exists()
    overrun.refresh()
    assert overrun.status == TaskResultStatus.FAILED
    assert "exceeded the maximum runtime of 0.5s" in row(overrun).failure_message
    long.refresh()
    assert long.status == TaskResultStatus.FAILED  # canceled
    assert row(long).state == JobState.CANCELED


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_async_tasks_as_coroutines_on_its_event_loop(run_worker):
    t.InFlight.now, t.InFlight.most, t.InFlight.threads = 0, 0, set()
    results = [t.in_flight.enqueue(0.5) for _ in range(20)]
    plain = t.add.enqueue(1, 2)
    tw = run_worker(task_handlers(num_handlers=20), with_resetter=False)
    wait_until(lambda: not TaskJob.objects.filter(state__in=["queued", "processing"]).exists(), 30)
    assert tw.stop() == 0
    assert {row(r).is_async for r in results} == {True}
    assert not row(plain).is_async
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert len(t.InFlight.threads) == 1  # one thread whatever the number in flight
    assert next(iter(t.InFlight.threads)).endswith("-loop"), t.InFlight.threads
    assert t.InFlight.most >= 10


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_runworker_tasks_with_queue(spawn):
    emails = [t.noop_email.enqueue() for _ in range(3)]
    others = [t.noop.enqueue() for _ in range(3)]
    proc = spawn("runworker", "--tasks", "--queue", "emails", "--burst")
    assert proc.wait(60) == 0, proc.output
    assert {row(r).state for r in emails} == {"completed"}
    assert {row(r).state for r in others} == {"queued"}
    proc = spawn("runworker", "--tasks", "--burst")
    assert proc.wait(60) == 0, proc.output
    assert {row(r).state for r in others} == {"completed"}


def test_wrong_queue_or_backend_is_a_command_error():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="queue 'nowhere' is not one of"):
        call_command("runworker", "--tasks", "--queue", "nowhere", "--burst")
    with pytest.raises(CommandError, match="TASKS has no backend 'other'"):
        call_command("runworker", "--tasks", "--backend", "other", "--burst")
    with pytest.raises(CommandError, match="go with --tasks"):
        call_command("runworker", "tests.testapp.handlers.BehaviorHandler", "--queue", "emails")


@pytest.mark.django_db(transaction=True)
def test_enqueue_is_one_statement_and_the_result_has_its_id():
    with CaptureQueriesContext(connection) as queries:
        result = t.add.enqueue(2, 3)
    assert len(queries.captured_queries) == 1, [q["sql"][:80] for q in queries]
    job = row(result)
    assert (job.task_path, job.args, job.state) == (t.add.module_path, [2, 3], "queued")
    assert job.queued_at is not None
    assert job.enqueued_at is not None


# -- a backend without QUEUES ----------------------------------------------------------


@pytest.fixture
def every_queue(settings):
    """The default backend with ``QUEUES: []``: Django validates no queue name, so every
    queue must be served."""
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": []}}
    return tasks.task_backends["default"]


def test_a_backend_without_queues_serves_every_queue(every_queue):
    assert every_queue.queues == set()
    results = [t.add.using(queue_name=q).enqueue(1, 2) for q in ("default", "reports", "x-1")]
    assert run_tasks().attempts == 3
    for result in results:
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    [handler, *_] = task_handlers()
    assert handler.name == "tasks:default[*]"
    only = t.add.using(queue_name="reports").enqueue(2, 2)
    other = t.add.using(queue_name="x-1").enqueue(2, 2)
    assert run_tasks(queues=["reports"]).attempts == 1  # --queue: exactly those
    only.refresh()
    other.refresh()
    assert (only.status, other.status) == (TaskResultStatus.SUCCESSFUL, TaskResultStatus.READY)


@pytest.mark.django_db(transaction=True)
def test_runworker_tasks_serves_every_queue_of_a_backend_without_queues(every_queue):
    from django.core.management import call_command

    results = [t.add.using(queue_name=q).enqueue(1, 1) for q in ("default", "reports")]
    call_command("runworker", "--tasks", "--burst", verbosity=0)
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    late = t.add.using(queue_name="nightly").enqueue(1, 1)
    call_command("runworker", "--tasks", "--queue", "nightly", "--burst", verbosity=0)
    late.refresh()
    assert late.status == TaskResultStatus.SUCCESSFUL


# -- attempt times: started_at is the first attempt's --------------------------------------


def attempt_times_seen():
    """(started_at, last_attempted_at) of the result each attempt of ``t.timed`` saw."""
    return [
        tuple(datetime.fromisoformat(value) for value in event.detail.split())
        for event in Event.objects.filter(kind="times").order_by("id")
    ]


@pytest.mark.django_db(transaction=True)  # on PostgreSQL, now() is per transaction
def test_started_at_is_the_first_attempts_start_and_last_attempted_at_the_latests():
    result = t.timed.enqueue(2)  # fails twice, then succeeds (retry_after=0)
    run_tasks()
    seen = attempt_times_seen()
    assert len(seen) == 3
    (first, first_last), (second, second_last), (third, third_last) = seen
    assert first == first_last  # the first attempt: the same time, as Django's backends
    assert second == third == first
    assert first < second_last < third_last
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert (result.started_at, result.last_attempted_at) == (first, third_last)


@pytest.mark.django_db(transaction=True)
def test_attempt_times_of_a_failed_task_retried_from_the_admin():
    result = t.timed.enqueue(9)  # fails its 4 attempts (max_retries=3)
    run_tasks()
    (first, _), *_, (_, fourth) = attempt_times_seen()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 4)
    assert (result.started_at, result.last_attempted_at) == (first, fourth)
    TaskJob.objects.filter(pk__in=pks(result)).retry()  # the admin's "retry"
    assert row(result).started_at is None
    result.refresh()
    assert result.status == TaskResultStatus.READY  # back in the queue; its times kept
    assert (result.started_at, result.last_attempted_at) == (first, fourth)
    assert first < fourth


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_attempt_times_survive_a_reset(spawn):
    """A worker killed during the second attempt: the resetter puts the task back in the
    queue (its row's started_at emptied); its result still says when the first and the
    latest attempt started."""
    from django.core.management import call_command

    result = t.timed.enqueue(1, nap=60)
    worker = spawn("runworker", "--tasks", "--no-resetter")
    wait_until(lambda: len(attempt_times_seen()) == 2, 30)
    worker.kill()
    (first, _), (_, second) = attempt_times_seen()
    TaskJob.objects.filter(pk__in=pks(result)).update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    call_command("runresetter", "--tasks", "--once", verbosity=0)
    job = row(result)
    assert (job.state, job.started_at, job.num_resets) == (JobState.QUEUED, None, 1)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert (result.started_at, result.last_attempted_at) == (first, second)
    assert first < second


@pytest.mark.django_db(transaction=True)
def test_a_task_the_resetter_fails_sends_task_finished(sent):
    """A task whose worker died once too often is failed by the resetter: its
    ``task_finished`` (FAILED) is sent then, as for any other failure; a reset that puts
    it back in the queue sends nothing."""
    from django_dbworker.maintenance.resetter import Resetter

    sent, finished = sent
    failing, requeued = t.add.enqueue(1, 1), t.add.enqueue(2, 2)
    stale = timezone.now() - timedelta(minutes=5)
    TaskJob.objects.filter(pk__in=pks(failing, requeued)).update(
        state=JobState.PROCESSING, worker_hostname="gone:1:aaaaaa", last_heartbeat_at=stale
    )
    TaskJob.objects.filter(pk__in=pks(failing)).update(num_resets=99)
    resetter = Resetter(task_handlers())
    try:
        resetter.run_once()
    finally:
        resetter.close()
    assert (row(failing).state, row(requeued).state) == (JobState.FAILED, JobState.QUEUED)
    assert [(s, status) for s, pk, status in sent if pk == failing.id][-1] == (
        "finished",
        "FAILED",
    )
    assert finished[failing.id][2], "finished_at is set"
    assert [s for s, pk, _ in sent if pk == requeued.id] == ["enqueued"]


# -- result ids ------------------------------------------------------------------------------


def test_result_ids_are_random_uuids_not_the_key():
    results = [t.add.enqueue(1, i) for i in range(3)]
    for result in results:
        key = uuid.UUID(hex=result.id)
        assert (key.version, key.hex) == (4, result.id)
        assert result.id != str(row(result).pk)
    assert len({r.id for r in results}) == 3


def test_get_result_takes_the_id_exactly_as_given_out():
    result = t.add.enqueue(1, 2)
    assert t.add.get_result(result.id).id == result.id
    key = uuid.UUID(hex=result.id)
    pk = row(result).pk
    for wrong in [
        str(pk),  # the primary key: sequential, guessable
        f"{pk}_0",
        f" {pk}",
        f" {result.id}",
        f"{result.id}\n",
        result.id.upper(),
        str(key),
        f"{{{result.id}}}",
        key.urn,
        "",
        "z" * 32,
        f"{result.id[:8]}_{result.id[9:]}",
    ]:
        with pytest.raises(TaskResultDoesNotExist):
            t.add.get_result(wrong)
    with pytest.raises(TaskResultDoesNotExist):
        t.add.get_result(uuid.uuid4().hex)  # well formed, but no such result


def test_a_row_inserted_without_a_result_id_gets_one_from_the_database():
    """A worker or web process of an older release (or plain SQL) inserts rows without
    the column: the database's default gives them a random id all the same."""
    table = connection.ops.quote_name(TaskJob._meta.db_table)
    with connection.cursor() as cursor:
        for _ in range(2):
            cursor.execute(f"INSERT INTO {table} (task_path) VALUES (%s)", [t.add.module_path])
    ids = [key.hex for key in TaskJob.objects.values_list("result_id", flat=True)]
    assert len(set(ids)) == 2
    assert {uuid.UUID(hex=value).version for value in ids} == {4}
    assert {t.add.get_result(value).status for value in ids} == {TaskResultStatus.READY}


def test_the_admin_finds_a_task_by_its_result_id(admin_client):
    result = t.add.enqueue(1, 2)
    other = t.add.enqueue(3, 4)
    url = reverse("admin:dbworker_tasks_taskjob_changelist")
    page = admin_client.get(url, {"q": result.id}).content.decode()
    assert f"/{row(result).pk}/change/" in page
    assert f"/{row(other).pk}/change/" not in page
    shown = admin_client.get(reverse("admin:dbworker_tasks_taskjob_change", args=pks(result)))
    assert result.id in shown.content.decode()


# -- engine options: @task on every Django version, using(), one spelling each ---------


def test_the_dbworker_task_decorator_takes_engine_options_on_every_django_version():
    made = dbworker_task(max_retries=4, retry_after=timedelta(seconds=3))(t.add.func)
    assert isinstance(made, DatabaseTask)
    assert (made.max_retries, made.retry_after, made.priority) == (4, timedelta(seconds=3), 0)
    assert dbworker_task(t.add.func) == t.add  # bare, as Django's
    with pytest.raises(TypeError, match=r"using\(run_after="):
        dbworker_task(run_after=timezone.now())


def test_engine_options_on_another_backend_say_which_backend_they_need(settings):
    immediate = f"{compat.tasks.__name__}.backends.immediate.ImmediateBackend"
    settings.TASKS = {**settings.TASKS, "inline": {"BACKEND": immediate}}
    with pytest.raises(TypeError, match=r"engine options need TASKS\['inline'\] to be django_"):
        dbworker_task(backend="inline", max_retries=2)(t.add.func)
    assert dbworker_task(backend="inline")(t.add.func).backend == "inline"  # none: fine


@pytest.mark.skipif(django.VERSION[:2] == (6, 0), reason="Django 6.0's @task takes no options")
def test_djangos_own_task_decorator_takes_them_too():
    """Django >= 6.1 (and the backport) pass them on to the backend's task_class."""
    made = tasks.task(max_retries=4)(t.add.func)
    assert isinstance(made, DatabaseTask)
    assert made.max_retries == 4


def test_using_sets_engine_options_for_the_runs_it_enqueues():
    retried = t.fails_always_plain.using(max_retries=2, retry_after=0).enqueue()
    once = t.fails_always_plain.enqueue()  # the task itself is unchanged
    assert row(retried).options == {"max_retries": 2, "retry_after": 0.0}
    assert row(once).options is None
    run_tasks()
    retried.refresh()
    once.refresh()
    assert (retried.status, retried.attempts) == (TaskResultStatus.FAILED, 3)
    assert (once.status, once.attempts) == (TaskResultStatus.FAILED, 1)
    assert retried.task.max_retries == 2  # the result's task is the one enqueued
    assert once.task.max_retries is None


def test_a_run_keeps_the_options_it_was_enqueued_with():
    result = t.flaky.using(max_retries=0).enqueue("kept", 1)  # flaky's own: 2
    assert row(result).options == {"max_retries": 0, "retry_after": 0.0}
    run_tasks()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)


def test_handler_spellings_and_typos_are_refused_with_the_task_spelling():
    with pytest.raises(TypeError, match="tasks spell the handler attribute max_num_retries as"):
        t.add.using(max_num_retries=3)
    with pytest.raises(TypeError, match="maximum_runtime_per_job as max_runtime"):
        dbworker_task(maximum_runtime_per_job=5)(t.add.func)
    with pytest.raises(TypeError, match="did you mean retry_after"):
        t.add.using(retry_afer=5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        t.add.using(colour="blue")


# -- a rolling deploy: workers and sites of the previous release on the migrated table ---

#: The last commit before result ids, first_started_at and stored options (the
#: previous release for the tasks app's migrations 0006-0008).
TASKS_OLD_COMMIT = "d1ac1f6"

PROJECT_TASKS = """
try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task
import time


@task
def nap(seconds):
    time.sleep(seconds)
    return seconds
"""

PROJECT_PROBE = """
import json

from .tasks import nap


def enqueue(count):
    print("PROBE", json.dumps([nap.enqueue(0.05).id for _ in range(count)]))


def results(ids):
    found = [nap.get_result(result_id) for result_id in ids]
    print("PROBE", json.dumps([[str(r.status), r.started_at is not None] for r in found]))


def rows():
    from django_dbworker.tasks.models import TaskJob

    rows = TaskJob.objects.order_by("pk").values_list("state", "result_id", "worker_ids")
    print("PROBE", json.dumps([[state, key.hex, workers] for state, key, workers in rows]))
"""


@pytest.mark.subprocess
@pytest.mark.skipif(
    getattr(settings, "POOLER", None) == "transaction",
    reason="the previous release does not run behind a transaction pooler (issue 30)",
)
def test_a_rolling_deploy_with_workers_and_sites_of_the_previous_release(project, tmp_path):  # noqa: F811
    """The previous release's tables are migrated (result ids for the rows there) while
    its site and worker run on; then an old and a new worker share the table while old
    and new sites enqueue. Every task runs once; each site finds its own results."""
    from django.db import connection as default_connection

    if default_connection.vendor == "mysql":
        pytest.skip("the previous release ran on PostgreSQL and SQLite only (dbworker.E006)")
    old = old_package(tmp_path, TASKS_OLD_COMMIT)
    project.core_apps.append("django_dbworker.tasks")
    if django.VERSION < (6, 0):
        project.core_apps.append("django_tasks")
    project.extra_settings = (
        'TASKS = {"default": {"BACKEND": "django_dbworker.tasks.DatabaseBackend", '
        '"OPTIONS": {"INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2}}}'
    )
    project.app("shop", tasks=PROJECT_TASKS, probe=PROJECT_PROBE)

    def probe(call, package=None):
        done = project.run("shell", "-c", f"from shop import probe; probe.{call}", package=package)
        assert done.returncode == 0, done.stderr
        return json.loads([x for x in done.stdout.splitlines() if x.startswith("PROBE ")][-1][6:])

    assert project.run("migrate", package=old).returncode == 0
    before = probe("enqueue(10)", package=old)  # the old release's ids: its primary keys
    assert [int(result_id) for result_id in before]
    migrated = project.run("migrate")  # dbworker_tasks 0006-0008
    assert migrated.returncode == 0, migrated.stderr
    assert probe(f"results({before!r})", package=old) == [["READY", False]] * 10

    workers = {
        "old": project.start("runworker", "--tasks", "--num-handlers", "2", package=old),
        "new": project.start("runworker", "--tasks", "--num-handlers", "2"),
    }
    # Both up before the rest is enqueued: a slow start on a loaded machine would leave
    # the other worker every task.
    wait_until(
        lambda: all(" started: " in worker.output for worker in workers.values()),
        60,
        interval=0.2,
        message="both workers to start",
    )
    probe("enqueue(20)", package=old)
    probe("enqueue(20)")
    rows = wait_until(
        lambda: (found := probe("rows()")) and {s for s, *_ in found} == {"completed"} and found,
        90,
        interval=0.5,
        message="the 50 tasks to complete under an old and a new worker",
    )
    for worker in workers.values():
        worker.proc.terminate()
        assert worker.wait(60) == 0, worker.output
        assert "Traceback" not in worker.output, worker.output
    assert len(rows) == 50
    assert len({key for _, key, _ in rows}) == 50  # a random id for every row
    assert all(len(ran) == 1 for *_, ran in rows)  # each ran once
    pids = {int(ran[0].split(":")[1]) for *_, ran in rows}
    assert pids == {worker.proc.pid for worker in workers.values()}
    assert probe(f"results({[key for _, key, _ in rows]!r})") == [["SUCCESSFUL", True]] * 50
    assert probe(f"results({before!r})", package=old) == [["SUCCESSFUL", True]] * 10
