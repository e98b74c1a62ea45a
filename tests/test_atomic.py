"""Transactional handlers (issue 44): ``atomic``, ``complete()``, ``attempt.completing()``
and phase middleware, in the testing helpers and on real workers. All databases."""

import logging

import pytest
from django.test import override_settings

from django_dbworker.checks import validate_handler
from django_dbworker.testing import run_jobs
from tests.conftest import test_database_url as database_url
from tests.conftest import wait_until
from tests.test_pooler import needs_pgbouncer, pgbouncer  # noqa: F401 - a fixture
from tests.testapp import ledger
from tests.testapp.models import Event, LedgerCounter, LedgerEntry, LedgerJob


@pytest.fixture
def counter(db):
    return LedgerCounter.objects.create(name="total")


def total():
    return LedgerCounter.objects.get(name="total").value


def entries(job):
    return list(LedgerEntry.objects.filter(job_id=job.pk).values_list("phase", flat=True))


# -- the testing helpers: the test's own transaction -------------------------------------


@pytest.mark.django_db
def test_an_atomic_handler_commits_its_writes_with_its_completion(counter):
    job = LedgerJob.objects.create()
    assert run_jobs(ledger.LedgerHandler).completed == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.result, job.finished_at is not None) == (
        "completed",
        {"job": job.pk, "tenant": None},
        True,
    )
    assert (entries(job), total()) == (["handle"], 1)


@pytest.mark.django_db
def test_what_an_atomic_handler_wrote_before_raising_is_rolled_back(counter):
    job = LedgerJob.objects.create(behavior="fail")
    assert run_jobs(ledger.LedgerHandler, max_num_retries=0).failed == [job.pk]
    job.refresh_from_db()
    assert "RuntimeError: boom after the writes" in job.failure_message
    assert (entries(job), total()) == ([], 0)


@pytest.mark.django_db
def test_the_control_keeps_what_it_wrote_before_raising(counter):
    job = LedgerJob.objects.create(behavior="fail")
    assert run_jobs(ledger.LedgerPlainHandler, max_num_retries=1, retries="now").failed == [job.pk]
    assert (entries(job), total()) == (["handle", "handle"], 2)


@pytest.mark.django_db
def test_complete_runs_in_the_completions_transaction(counter):
    ok, broken = LedgerJob.objects.create(), LedgerJob.objects.create(behavior="fail_complete")
    run = run_jobs(ledger.LedgerCompleteHandler, max_num_retries=0)
    assert (run.completed, run.failed) == ([ok.pk], [broken.pk])
    ok.refresh_from_db()
    broken.refresh_from_db()
    assert ok.result == {"job": ok.pk, "tenant": None}  # what handle() returned
    assert (entries(ok), entries(broken), total()) == (["complete"], [], 1)
    assert "RuntimeError: complete() broke" in broken.failure_message


@pytest.mark.django_db
def test_completing_commits_the_block_with_the_completion(counter):
    job = LedgerJob.objects.create()
    assert run_jobs(ledger.LedgerCompletingHandler).completed == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.result, entries(job), total()) == (
        "completed",
        {"via": "completing"},
        ["completing"],
        1,
    )


@pytest.mark.django_db
@override_settings(DBWORKER={"MIDDLEWARE": ["tests.testapp.middleware.Phased"]})
def test_phase_middleware_wraps_each_phase_and_hands_the_handler_context(counter):
    job = LedgerJob.objects.create()
    assert run_jobs(ledger.LedgerHandler).completed == [job.pk]
    job.refresh_from_db()
    assert job.result == {"job": job.pk, "tenant": f"tenant-{job.pk}"}
    kinds = list(Event.objects.filter(job_id=job.pk).order_by("pk").values_list("kind", "detail"))
    assert kinds == [
        ("phase:prepare", ""),
        ("phase:handle", ""),
        ("phase:complete", repr({"job": job.pk, "tenant": f"tenant-{job.pk}"})),
    ]


@pytest.mark.django_db
@override_settings(DBWORKER={"MIDDLEWARE": ["tests.testapp.middleware.Phased"]})
def test_what_complete_middleware_writes_is_rolled_back_with_a_failing_attempt(counter):
    job = LedgerJob.objects.create(behavior="fail_complete")
    assert run_jobs(ledger.LedgerCompleteHandler, max_num_retries=0).failed == [job.pk]
    kinds = list(Event.objects.filter(job_id=job.pk).values_list("kind", flat=True))
    assert kinds == ["phase:prepare", "phase:handle"]  # not phase:complete


# -- real workers ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_atomic_handler_on_a_worker_stores_its_log_checkin_and_result(run_worker, counter):
    jobs = [LedgerJob.objects.create(behavior="log") for _ in range(3)]
    failing = LedgerJob.objects.create(behavior="fail")
    tw = run_worker(ledger.LedgerHandler(max_num_retries=0), burst=True)
    assert tw.join() == 0
    for job in jobs:
        job.refresh_from_db()
        assert (job.state, job.result["job"], entries(job)) == ("completed", job.pk, ["handle"])
        assert job.progress["text"] == "half"
        assert [entry["key"] for entry in job.execution_logs] == ["step"]
    failing.refresh_from_db()
    assert (failing.state, entries(failing)) == ("failed", [])
    assert total() == 3
    written = tw.worker.writer.counts
    assert (written["completed"], written["failed"]) == (3, 1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "handler", [ledger.LedgerHandler, ledger.LedgerCompleteHandler, ledger.LedgerCompletingHandler]
)
@pytest.mark.parametrize("found_by", ["fence", "heartbeat"])
def test_a_stale_attempts_work_never_commits(run_worker, counter, handler, found_by, caplog):
    """The row is taken from the attempt while it runs (reset and claimed by another
    worker): its fenced completion finds nothing (or its heartbeat saw it first), its
    transaction rolls back, and the writer writes nothing over the row."""
    job = LedgerJob.objects.create(behavior="sleep", payload={"seconds": 1.0})
    caplog.set_level(logging.WARNING, "django_dbworker.lane")
    # Without a heartbeat meanwhile the fence of the completion is what finds the row gone.
    beat = 60 if found_by == "fence" else 0.1
    tw = run_worker(handler(heartbeat_interval=beat), with_resetter=False)
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="ledger:sleeping").exists())
    assert LedgerJob.objects.filter(pk=job.pk, state="processing").update(
        worker_hostname="host:1:another-worker"
    )
    wait_until(lambda: tw.worker.writer.counts["lost"] == 1)
    tw.stop()
    job.refresh_from_db()
    assert (job.state, job.worker_hostname, job.finished_at) == (
        "processing",
        "host:1:another-worker",
        None,
    )
    assert (entries(job), total()) == ([], 0)
    assert ("no longer this attempt's" in caplog.text) == (found_by == "fence")


@pytest.mark.django_db(transaction=True)
def test_an_atomic_attempt_past_its_runtime_is_rolled_back(run_worker, counter):
    job = LedgerJob.objects.create(behavior="sleep", payload={"seconds": 0.6})
    handler = ledger.LedgerHandler(maximum_runtime_per_job=0.2, max_num_retries=0)
    assert run_worker(handler, burst=True).join() == 0
    job.refresh_from_db()
    assert job.state == "failed"
    assert "exceeded the maximum runtime of 0.2s" in job.failure_message
    assert (entries(job), total()) == ([], 0)


@pytest.mark.django_db(transaction=True)
def test_post_handle_sees_an_outcome_its_transaction_committed(run_worker, counter):
    class Posting(ledger.LedgerHandler):
        def post_handle(self, job, outcome):
            Event.objects.create(job_id=job.pk, kind=f"post:{outcome.state}")

    ok, failing = LedgerJob.objects.create(), LedgerJob.objects.create(behavior="fail")
    assert run_worker(Posting(max_num_retries=0), burst=True).join() == 0
    posted = set(Event.objects.values_list("job_id", "kind"))
    assert posted == {(ok.pk, "post:completed"), (failing.pk, "post:failed")}


def test_atomic_and_complete_need_a_sync_handle():
    class AsyncAtomic(ledger.LedgerHandler):
        async def handle(self, job):
            return None

    class AsyncComplete(ledger.LedgerCompleteHandler):
        async def handle(self, job):
            return None

    for handler in (AsyncAtomic, AsyncComplete):
        errors = [m for m in validate_handler(handler) if m.id == "dbworker.E040"]
        assert len(errors) == 1, handler
        assert "Django's transactions do not work in async code" in errors[0].msg
    assert [m.id for m in validate_handler(ledger.LedgerHandler) if m.id == "dbworker.E040"] == []


@pytest.mark.django_db
def test_an_atomic_handler_on_a_single_writer_is_warned_unless_bounded():
    from django.db import connection

    def warned(handler):
        return [m.id for m in validate_handler(handler) if m.id == "dbworker.W040"]

    one_writer = connection.vendor == "sqlite"
    assert warned(ledger.LedgerHandler) == (["dbworker.W040"] if one_writer else [])
    assert warned(ledger.LedgerHandler(maximum_runtime_per_job=1)) == []
    assert warned(ledger.LedgerCompleteHandler) == []  # the lock only for its final writes


@needs_pgbouncer
@pytest.mark.django_db(transaction=True)
def test_atomic_handlers_through_pgbouncer_in_transaction_mode(spawn, pgbouncer, counter):  # noqa: F811
    bouncer = pgbouncer("transaction")
    env = {"DATABASE_URL": bouncer.url(database_url())}
    ok = [LedgerJob.objects.create(behavior="log") for _ in range(20)]
    failing = LedgerJob.objects.create(behavior="fail")
    worker = spawn("runworker", "tests.testapp.ledger.LedgerHandler", "--burst", env=env)
    assert worker.wait(60) == 0, worker.output
    states = dict(LedgerJob.objects.values_list("pk", "state"))
    assert {states[job.pk] for job in ok} == {"completed"}
    assert states[failing.pk] == "failed"
    assert LedgerEntry.objects.count() == total() == 20
    assert not LedgerEntry.objects.filter(job_id=failing.pk).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "kept"), [("ledger_entry", 0), ("plain_ledger_entry", 1)])
def test_an_atomic_task_keeps_nothing_of_a_failed_run(name, kept):
    from django_dbworker.testing import run_tasks
    from tests.testapp import tasks

    task = getattr(tasks, name)
    ok = task.enqueue(1)
    task.enqueue(2, fail=True)
    run = run_tasks()
    assert (len(run.completed), len(run.failed)) == (1, 1)
    ok.refresh()
    assert ok.return_value == 1
    assert LedgerEntry.objects.filter(job_id=1).count() == 1
    assert LedgerEntry.objects.filter(job_id=2).count() == kept


async def async_work():
    return None


def test_an_async_task_cannot_be_atomic():
    from django_dbworker.tasks import task
    from django_dbworker.tasks.backend import InvalidTask
    from tests.testapp import tasks

    with pytest.raises(InvalidTask, match="atomic needs a plain def function"):
        task(atomic=True)(async_work)
    with pytest.raises(TypeError, match="unexpected keyword argument 'atomic'"):
        tasks.ledger_entry.using(atomic=False)


@pytest.mark.django_db(transaction=True)
@override_settings(DBWORKER={"MIDDLEWARE": ["tests.testapp.middleware.Phased"]})
def test_phase_middleware_wraps_an_async_handlers_phases(run_worker):
    from tests.testapp.handlers import AsyncOrmHandler
    from tests.testapp.models import QueueJob

    job = QueueJob.objects.create()
    assert run_worker(AsyncOrmHandler(), burst=True).join() == 0
    assert QueueJob.objects.get(pk=job.pk).state == "completed"
    kinds = set(Event.objects.filter(job_id=job.pk).values_list("kind", flat=True))
    assert {"phase:prepare", "phase:handle", "phase:complete"} <= kinds


def test_phase_middleware_that_cannot_be_built_is_a_check_error():
    class NeedsArguments:
        def __init__(self, required):
            pass

        def wrap_handle(self, next_call):
            return next_call

    class Broken(ledger.LedgerHandler):
        middleware = [NeedsArguments]

    messages = [m.msg for m in validate_handler(Broken) if m.id == "dbworker.E011"]
    assert len(messages) == 1
    assert "missing 1 required positional argument" in messages[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("check", "state", "kept"), [(False, "completed", 1), (True, "canceled", 0)]
)
def test_an_operators_cancel_of_a_running_atomic_job(run_worker, counter, check, state, kept):
    """As for any handler: one that returns completes the job, one that stops on the
    cancel ends it canceled, and then nothing it wrote is kept."""
    job = LedgerJob.objects.create(
        behavior="sleep", payload={"seconds": 1.0, "check_cancel": check}
    )
    tw = run_worker(ledger.LedgerHandler(heartbeat_interval=0.1), with_resetter=False)
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="ledger:sleeping").exists())
    LedgerJob.objects.filter(pk=job.pk).update(cancel=True)
    wait_until(lambda: LedgerJob.objects.get(pk=job.pk).state != "processing")
    tw.stop()
    assert LedgerJob.objects.get(pk=job.pk).state == state
    assert (len(entries(job)), total()) == (kept, kept)
