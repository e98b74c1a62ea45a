"""Multi-database routing against the other capabilities (the interaction matrix of
issue 31, docs/reliability.md): a router that sends every read to a replica, an alias
that does not even exist here, so that any read of the engine's that goes there
fails. Jobs and their bookkeeping must be read where they are written (a replica
lags: a claim, a unique key or a rate bucket read there would be stale). The test's
own reads come after the router is gone. Both databases."""

import datetime

import pytest
from django.test import override_settings
from django.utils import timezone

from django_dbworker.control.models import ScheduleTick
from django_dbworker.maintenance.resetter import Resetter
from django_dbworker.maintenance.retention import Retention
from django_dbworker.maintenance.scheduler import Scheduler
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob, ReportJob, TenantJob

pytestmark = pytest.mark.django_db(transaction=True)


class ReplicaRouter:
    def db_for_read(self, model, **hints):
        return "replica"

    def db_for_write(self, model, **hints):
        return "default"


def replica():
    return override_settings(DATABASE_ROUTERS=[f"{__name__}.ReplicaRouter"])


def test_enqueue_unique_goes_to_the_primary():
    """Routing x unique."""
    with replica():
        first, created = ReportJob.objects.enqueue_unique(tenant="acme", payload={"v": 1})
        held, again = ReportJob.objects.enqueue_unique(tenant="acme", payload={"v": 2})
        replaced, _ = ReportJob.objects.enqueue_unique(
            tenant="acme", payload={"v": 3}, on_conflict="replace"
        )
    assert (created, again, held.pk, held.payload) == (True, False, first.pk, {"v": 1})
    assert (replaced.pk, replaced.payload) == (first.pk, {"v": 3})
    assert ReportJob.objects.get(pk=first.pk).payload == {"v": 3}


def test_bulk_enqueue_goes_to_the_primary():
    """Routing x bulk enqueue: an insert belongs on ``db_for_write``, as ``bulk_create``
    (which marks its queryset for writing) does. Found by issue 31's matrix: on
    PostgreSQL the COPY went through the read alias (the replica)."""
    with replica():
        written = QueueJob.objects.bulk_enqueue([QueueJob(behavior="ok") for _ in range(3)])
    assert (written, QueueJob.objects.count()) == (3, 3)


def test_cancel_retry_and_run_now_go_to_the_primary():
    """Routing x cancel and retry (the operator's operations)."""
    queued = QueueJob.objects.create()
    failed = QueueJob.objects.create(state="failed", finished_at=timezone.now())
    later = QueueJob.objects.create(process_after=timezone.now() + datetime.timedelta(hours=1))
    with replica():
        assert QueueJob.objects.filter(pk=queued.pk).cancel() == (1, 0)
        assert QueueJob.objects.filter(pk=failed.pk).retry() == 1
        assert QueueJob.objects.filter(pk=later.pk).run_now() == 1
    states = dict(QueueJob.objects.values_list("pk", "state"))
    assert states == {queued.pk: "canceled", failed.pk: "queued", later.pk: "queued"}
    assert QueueJob.objects.get(pk=later.pk).process_after is None  # claimable now


def test_the_resetter_retention_and_the_scheduler_go_to_the_primary():
    """Routing x reset, retention and periodic schedules."""

    class Maintained(h.ScheduledHandler):
        retention = {"completed": datetime.timedelta(hours=1)}

    old = timezone.now() - datetime.timedelta(days=2)
    stale = timezone.now() - datetime.timedelta(minutes=5)
    dead = QueueJob.objects.create(
        state="processing", worker_hostname="gone:1:aaaaaa", last_heartbeat_at=stale
    )
    done = QueueJob.objects.create(state="completed", finished_at=old)
    handler = Maintained()
    with replica():
        resetter = Resetter([handler])
        try:
            resetter.run_once()
        finally:
            resetter.close()
        retention = Retention([handler])
        try:
            assert retention.run_once(budget=30) == {handler.get_name(): 1}
        finally:
            retention.close()
        scheduler = Scheduler([handler])
        now = timezone.now()
        scheduler._pass(now)
        scheduler._pass(now + datetime.timedelta(seconds=2))
    reset = QueueJob.objects.get(pk=dead.pk)
    assert (reset.state, reset.num_resets) == ("queued", 1)
    assert not QueueJob.objects.filter(pk=done.pk).exists()
    assert ScheduleTick.objects.count() >= 1
    assert QueueJob.objects.filter(behavior="tick").count() == ScheduleTick.objects.count()


class CheckingIn(h.LimitedHandler):
    """Limits, a rate limit per key, and a check-in per job."""

    rate_limit_per_key = "100/s"

    def behave(self, job):
        self.attempt.checkin("half way", done=1, total=2)


def test_a_worker_with_limits_rate_limits_and_check_ins_uses_the_primary(run_worker):
    """Routing x limits, rate limits and check-ins, on a real worker."""
    TenantJob.objects.bulk_create(TenantJob(tenant=t % 4) for t in range(12))
    with replica():
        assert run_worker(CheckingIn(), burst=True).join() == 0
    assert set(TenantJob.objects.values_list("state", flat=True)) == {"completed"}
    assert {job.progress["text"] for job in TenantJob.objects.all()} == {"half way"}


class AsyncOk(h.BehaviorHandler):
    async def handle(self, job):
        self.attempt.checkin("async", done=1, total=1)


def test_async_handlers_and_tasks_use_the_primary(run_worker):
    """Routing x async handlers and tasks."""
    from django_dbworker.tasks.handler import task_handlers
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp import tasks as t

    jobs = [QueueJob.objects.create() for _ in range(5)]
    with replica():
        results = [t.add.enqueue(i, 1) for i in range(3)]
        coroutine = t.in_flight.enqueue(0.01)
        assert run_worker(AsyncOk(), burst=True).join() == 0
        assert run_worker(task_handlers(), burst=True).join() == 0
    assert {QueueJob.objects.get(pk=j.pk).state for j in jobs} == {"completed"}
    rows = TaskJob.objects.filter(result_id__in=[r.id for r in results])
    assert sorted(rows.values_list("return_value", flat=True)) == [1, 2, 3]
    assert TaskJob.objects.get(result_id=coroutine.id).state == "completed"


def test_a_consumer_reads_its_table_and_checkpoint_on_the_primary(run_worker):
    """Routing x consumers: a consumer's table, checkpoint and frontier are read on its
    model's ``db_for_write`` (a replica would hand it a stale frontier)."""
    from django_dbworker.consumers.runner import ConsumerRunner
    from tests.conftest import wait_until
    from tests.testapp.consumers import AllEvents
    from tests.testapp.models import Handled, OrderEvent

    OrderEvent.objects.bulk_create(OrderEvent() for _ in range(20))
    ids = list(OrderEvent.objects.order_by("id").values_list("id", flat=True))
    handled = Handled.objects.using("default").filter(consumer="all_events")

    class Events(AllEvents):
        def handle_batch(self, rows):  # writes named explicitly: Django's bulk_create
            # looks up the features of the read alias's connection, absent here
            Handled.objects.using("default").bulk_create(
                Handled(consumer=self.name, position=r.id, worker="w", at=0.0) for r in rows
            )

    with replica():
        runner = ConsumerRunner([Events()], rebalance_interval=0.2)
        tw = run_worker([], with_resetter=False, companions=[runner])
        wait_until(
            lambda: list(handled.order_by("id").values_list("position", flat=True)) == ids,
            20,
            message="every event handled once, in order",
        )
        assert tw.stop() == 0
