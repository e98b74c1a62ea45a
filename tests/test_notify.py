"""Wake-ups: NOTIFY/LISTEN on PostgreSQL, adaptive polling everywhere."""

import time

import pytest
from django.db import connection, transaction

from django_dbworker.checks import validate_handler
from django_dbworker.models import job_models
from django_dbworker.sql.triggers import INSERT_TRIGGER, UPDATE_TRIGGER, sync_triggers
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db(transaction=True)

needs_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="LISTEN/NOTIFY: PostgreSQL only"
)


class SlowPollHandler(h.BehaviorHandler):
    """Polls every 30 s: a job started sooner was woken by a notification."""

    interval = 30
    max_interval = 30


def idle_worker(run_worker, handler):
    tw = run_worker(handler)
    lane = tw.worker.lanes[0]
    wait_until(lambda: lane.next_claim_at > time.monotonic(), 10, message="the first idle claim")
    return tw, lane


def completed():
    return QueueJob.objects.filter(state="completed").count()


@pytest.mark.parametrize(
    "enqueue",
    [
        pytest.param(lambda: QueueJob.objects.create(), id="create"),
        pytest.param(
            lambda: QueueJob.objects.bulk_create([QueueJob() for _ in range(5)]), id="bulk"
        ),
        pytest.param(lambda: QueueJob.objects.bulk_enqueue([QueueJob()]), id="bulk_enqueue"),
        pytest.param(lambda: QueueJob().save(), id="save"),
    ],
)
def test_jobs_this_process_enqueues_wake_its_idle_worker_at_once(run_worker, settings, enqueue):
    """Without NOTIFY (SQLite, MariaDB) a job enqueued in the worker's own process (by a
    handler, or the site's process that embeds a worker) waited for the next poll,
    up to ``max_interval``: the enqueue now wakes the worker at commit (on PostgreSQL the
    NOTIFY does). No probe: it would find them too."""
    settings.DBWORKER = {"PROBE_INTERVAL": None}
    tw, lane = idle_worker(run_worker, SlowPollHandler())
    if tw.worker.listeners:
        wait_until(lambda: tw.worker.listeners[0].connected.is_set(), 10, message="LISTEN")
    with transaction.atomic():
        enqueue()
        time.sleep(0.3)
        assert completed() == 0  # not before the commit
    n = QueueJob.objects.count()
    wait_until(lambda: completed() == n, 10, message="the woken worker")
    assert lane.next_claim_at > time.monotonic() + 5  # idle again, with its slow poll


@needs_postgres
@pytest.mark.parametrize(
    "enqueue",
    [
        pytest.param(lambda: QueueJob.objects.create(), id="create"),
        pytest.param(
            lambda: QueueJob.objects.bulk_create([QueueJob() for _ in range(5)]), id="bulk"
        ),
        pytest.param(lambda: QueueJob().save(), id="save"),
    ],
)
def test_enqueueing_wakes_an_idle_worker_at_once(run_worker, enqueue):
    tw, _ = idle_worker(run_worker, SlowPollHandler())
    wait_until(lambda: tw.worker.listeners[0].connected.is_set(), 10, message="LISTEN")
    enqueue()
    n = QueueJob.objects.count()
    wait_until(lambda: completed() == n, 10, message="the woken worker")


@needs_postgres
def test_retry_wakes_workers_and_a_rolled_back_enqueue_does_not(run_worker):
    job = JobFactory(state="failed")
    tw, lane = idle_worker(run_worker, SlowPollHandler())
    wait_until(lambda: tw.worker.listeners[0].connected.is_set(), 10, message="LISTEN")
    seen = lane.notifications
    with transaction.atomic():
        QueueJob.objects.create()
        transaction.set_rollback(True)
    time.sleep(0.5)
    assert lane.notifications == seen
    QueueJob.objects.filter(pk=job.pk).retry()
    wait_until(lambda: completed() == 1, 10, message="the retried job")


def raw_insert():
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {QueueJob._meta.db_table} (behavior, payload, priority, size) "
            "VALUES ('ok', '{}', 0, 1), ('ok', '{}', 0, 1)"
        )


@pytest.mark.parametrize("probe", [0.05, None])
def test_without_notify_a_probe_sees_the_rows_others_insert(run_worker, settings, probe):
    """Rows another process inserts (here plain SQL, which neither notifies nor wakes
    this process) are seen by the idle worker's probe of the table's largest key
    (``PROBE_INTERVAL``), not at its next poll 30 s later; no news, no claim."""
    settings.DBWORKER = {"NOTIFY": False, "PROBE_INTERVAL": probe}
    JobFactory(state="completed")
    tw, lane = idle_worker(run_worker, SlowPollHandler())
    assert tw.worker.listeners == []
    time.sleep(0.5)  # probes that find nothing new ...
    claims = tw.worker.dispatcher.claims_made
    time.sleep(0.5)
    assert tw.worker.dispatcher.claims_made == claims  # ... claim nothing
    raw_insert()
    if probe is None:
        time.sleep(2)
        assert completed() == 1  # only the poll, 30 s away, would find them
        return
    wait_until(lambda: completed() == 3, 5, message="the probing worker")
    assert tw.worker.dispatcher.claims_made <= claims + 3
    assert lane.next_claim_at > time.monotonic() + 5  # its poll stays slow


@needs_postgres
def test_plain_sql_inserts_and_updates_wake_an_idle_worker(run_worker):
    failed = JobFactory(state="failed")
    tw, lane = idle_worker(run_worker, SlowPollHandler())
    wait_until(lambda: tw.worker.listeners[0].connected.is_set(), 10, message="LISTEN")
    raw_insert()  # one statement, two rows: the statement trigger
    wait_until(lambda: completed() == 2, 10, message="the woken worker")
    with connection.cursor() as cursor:  # a row made claimable: the row trigger
        cursor.execute(
            f"UPDATE {QueueJob._meta.db_table} SET state = 'queued' WHERE id = %s", [failed.pk]
        )
    wait_until(lambda: completed() == 3, 10, message="the job made claimable")
    # The worker's own statements (claims, heartbeats, outcomes) notify nobody.
    seen = lane.notifications
    time.sleep(0.5)
    assert lane.notifications == seen


@needs_postgres
def test_without_triggers_plain_sql_waits_for_notify_workers(run_worker, settings):
    settings.DBWORKER = {"NOTIFY_TRIGGERS": False}
    try:
        assert sync_triggers(job_models()) == [m._meta.db_table for m in job_models()]
        assert not triggers_of(QueueJob)
        tw, _ = idle_worker(run_worker, SlowPollHandler())
        wait_until(lambda: tw.worker.listeners[0].connected.is_set(), 10, message="LISTEN")
        raw_insert()
        time.sleep(0.5)
        assert completed() == 0  # plain SQL sends nothing ...
        QueueJob.notify_workers()  # ... until told
        wait_until(lambda: completed() == 2, 10, message="the woken worker")
    finally:
        settings.DBWORKER = {}
        sync_triggers(job_models())
    assert triggers_of(QueueJob) == {INSERT_TRIGGER, UPDATE_TRIGGER}


def triggers_of(model):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
            [model._meta.db_table],
        )
        return {name for (name,) in cursor.fetchall()}


@needs_postgres
def test_without_notify_the_worker_polls(run_worker, settings):
    settings.DBWORKER = {"NOTIFY": False}
    tw = run_worker(h.BehaviorHandler())
    assert tw.worker.listeners == []
    QueueJob.objects.create()
    wait_until(lambda: completed() == 1, 10, message="the polling worker")


def test_polling_backs_off_while_idle_and_resets_on_work(run_worker):
    # From the base back to the slowest poll takes 0.05 + 0.1 + ... + 0.8 = 1.55 s: the
    # window in which the reset is seen after the job is that long, even on a busy machine.
    handler = h.BehaviorHandler(interval=0.05, max_interval=1.6)
    tw = run_worker(handler)
    lane = tw.worker.lanes[0]
    wait_until(lambda: lane.idle_interval == 1.6, 10, message="the slowest poll")
    JobFactory()
    wait_until(lambda: completed() == 1, 10, message="the job")
    wait_until(lambda: lane.idle_interval < 1.6, 5, message="polling back at its base")


def test_max_interval_below_interval_is_refused():
    messages = validate_handler(h.BehaviorHandler(interval=2, max_interval=1))
    assert [m.id for m in messages] == ["dbworker.E004"]
    assert "max_interval" in messages[0].msg


def test_ack_each_job_writes_every_completion(run_worker):
    JobFactory.create_batch(30)
    assert run_worker(h.BehaviorHandler(ack_each_job=True), burst=True).join() == 0
    assert completed() == 30
