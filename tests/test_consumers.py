"""Consumers in a worker thread: order, scope, gaps, pause, failures, fencing, checks,
the commands and the admin (both databases)."""

import io
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.db.models import F
from django.urls import reverse

from django_dbworker.consumers.batch import Batches, BatchTimeout, Fence, Lost
from django_dbworker.consumers.checks import validate_consumer
from django_dbworker.consumers.runner import ConsumerRunner
from django_dbworker.models import AuditEntry, ConsumerCheckpoint, ConsumerGapSkip
from tests.conftest import wait_until
from tests.testapp.consumers import AllEvents, Fails, Orders, Recording
from tests.testapp.models import Handled, OrderEvent

pytestmark = pytest.mark.django_db(transaction=True)


def handled(name):
    return list(
        Handled.objects.filter(consumer=name).order_by("id").values_list("position", flat=True)
    )


def start(run_worker, *consumers):
    runner = ConsumerRunner(list(consumers), rebalance_interval=0.2)
    return run_worker([], with_resetter=False, companions=[runner])


def test_in_order_exactly_once_and_scoped(run_worker):
    events = OrderEvent.objects.bulk_create(
        OrderEvent(aggregate_type="Order" if i % 3 else "Other") for i in range(230)
    )
    worker = start(run_worker, AllEvents(), Orders())
    ids = [e.pk for e in OrderEvent.objects.order_by("id")]
    wait_until(lambda: len(handled("all_events")) == 230 and len(handled("orders")) > 0, 20)
    orders = [e.pk for e in OrderEvent.objects.filter(aggregate_type="Order").order_by("id")]
    wait_until(lambda: handled("orders") == orders, 20)
    assert handled("all_events") == ids
    # The scoped consumer's checkpoint follows the unscoped frontier.
    wait_until(lambda: ConsumerCheckpoint.objects.get(name="orders").position == ids[-1], 10)
    assert len(events) == 230
    worker.stop()
    assert set(ConsumerCheckpoint.objects.values_list("running_by", flat=True)) == {""}


def test_gap_is_waited_for_then_passed_and_audited(run_worker):
    class QuickGaps(Recording):
        name = "quick_gaps"
        gap_threshold = 0.5

    OrderEvent.objects.bulk_create([OrderEvent(id=i) for i in (1, 2, 3, 6, 7)])
    worker = start(run_worker, QuickGaps())
    wait_until(lambda: handled("quick_gaps") == [1, 2, 3, 6, 7], 20)
    skip = ConsumerGapSkip.objects.get()
    assert (skip.consumer, skip.first_position, skip.last_position) == ("quick_gaps", 4, 5)
    assert skip.waited >= 0.5
    worker.stop()


def test_late_row_inside_threshold_is_not_skipped(run_worker):
    OrderEvent.objects.bulk_create([OrderEvent(id=i) for i in (1, 3)])
    worker = start(run_worker, AllEvents())  # gap_threshold 2s
    wait_until(lambda: handled("all_events") == [1], 10)
    OrderEvent.objects.create(id=2)
    wait_until(lambda: handled("all_events") == [1, 2, 3], 10)
    assert not ConsumerGapSkip.objects.exists()
    worker.stop()


def test_pause_resume_and_reset_are_audited(run_worker):
    worker = start(run_worker, AllEvents())
    wait_until(lambda: ConsumerCheckpoint.objects.filter(name="all_events").exists(), 10)
    call_command("dbworker_consumers", "pause", "all_events")
    OrderEvent.objects.bulk_create(OrderEvent() for _ in range(5))
    ids = list(OrderEvent.objects.order_by("id").values_list("id", flat=True))
    import time

    time.sleep(1.0)
    assert handled("all_events") == []
    call_command("dbworker_consumers", "resume", "all_events")
    wait_until(lambda: handled("all_events") == ids, 10)
    call_command("dbworker_consumers", "reset-checkpoint", "all_events", "--position", str(ids[2]))
    wait_until(lambda: handled("all_events") == ids + ids[3:], 10)
    actions = list(AuditEntry.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["pause", "resume", "reset checkpoint"]
    worker.stop()


def test_failing_batch_marks_the_consumer_failing_and_does_not_advance(run_worker):
    OrderEvent.objects.create(payload={"fail": True})
    worker = start(run_worker, Fails())
    wait_until(lambda: ConsumerCheckpoint.objects.filter(name="fails", failing=True).exists(), 20)
    row = ConsumerCheckpoint.objects.get(name="fails")
    assert row.position == 0
    assert "told to fail" in row.last_error
    assert handled("fails") == []
    worker.stop()


def test_a_batch_of_an_old_generation_commits_nothing():
    first = OrderEvent.objects.create()
    ConsumerCheckpoint.objects.create(
        name="all_events", position=first.pk - 1, owner="w1", running_by="w1", generation=2
    )
    with pytest.raises(Lost):
        Batches(AllEvents(), Fence("all_events", "w1", 1), 1.0).run_once()
    assert Batches(AllEvents(), Fence("all_events", "w1", 2), 1.0).run_once().handled == 1
    ConsumerCheckpoint.objects.update(owner="w2", generation=3)
    OrderEvent.objects.create()
    with pytest.raises(Lost):
        Batches(AllEvents(), Fence("all_events", "w1", 2), 1.0).run_once()
    assert ConsumerCheckpoint.objects.get().position == first.pk
    assert len(handled("all_events")) == 1


class Slow(AllEvents):
    batch_timeout = 0.3

    def handle_batch(self, rows):
        super().handle_batch(rows)
        if connection.vendor == "postgresql":  # the server ends the statement
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(5)")
        else:
            time.sleep(0.5)


def test_a_batch_past_its_timeout_is_rolled_back():
    first = OrderEvent.objects.create()
    ConsumerCheckpoint.objects.create(
        name="all_events", position=first.pk - 1, owner="w1", running_by="w1", generation=1
    )
    started = time.monotonic()
    with pytest.raises((BatchTimeout, OperationalError)):
        Batches(Slow(), Fence("all_events", "w1", 1), 1.0).run_once()
    assert time.monotonic() - started < 3
    assert ConsumerCheckpoint.objects.get().position == first.pk - 1
    assert handled("all_events") == []
    # The limit was the batch's only: the connection carries on without it.
    assert Batches(AllEvents(), Fence("all_events", "w1", 1), 1.0).run_once().handled == 1


def test_runworker_runs_consumers_beside_handlers():
    OrderEvent.objects.bulk_create(OrderEvent() for _ in range(3))
    call_command("runworker", "tests.testapp.consumers.AllEvents", "--max-time", "2.5", verbosity=0)
    assert len(handled("all_events")) == 3


class Tens(AllEvents):
    batch_size = 10


def test_lag_counts_the_backlog_and_how_long_the_consumer_is_behind():
    events = [OrderEvent.objects.create() for _ in range(25)]
    ConsumerCheckpoint.objects.create(
        name="all_events", position=events[0].pk - 1, owner="w1", running_by="w1", generation=1
    )
    batches = Batches(Tens(), Fence("all_events", "w1", 1), 1.0)

    def row():
        return ConsumerCheckpoint.objects.get()

    batches.run_once()  # a full window: the head is read from the table
    first = row()
    assert (first.position, first.head, first.lag) == (events[9].pk, events[-1].pk, 15)
    assert first.caught_up_at is not None  # it started with nothing seen ahead
    later = first.caught_up_at + timedelta(minutes=5)
    assert first.behind_for(later) >= timedelta(minutes=5)
    batches.run_once()
    assert row().caught_up_at == first.caught_up_at  # behind since then
    batches.run_once()
    assert row().lag == 0
    assert row().behind_for(later) is None
    call_command("dbworker_consumers", stdout=(out := io.StringIO()))
    assert "lag 0 rows," in out.getvalue()
    ConsumerCheckpoint.objects.update(head=F("head") + 7)  # as if it saw more
    call_command("dbworker_consumers", stdout=(out := io.StringIO()))
    assert "lag 7 rows (behind for" in out.getvalue()


def test_checks(settings):
    class Bad(Recording):
        name = ""
        position_field = "aggregate_type"
        batch_size = 0
        scope = "Order"

    ids = {m.id for m in validate_consumer(Bad())}
    assert ids == {"dbworker.E201", "dbworker.E203", "dbworker.E204", "dbworker.E205"}
    settings.DBWORKER = {"CONSUMERS": ["tests.testapp.consumers.Nope"], "CONSUMER_LEASE": 0}
    from django_dbworker.checks import check_consumers

    assert {m.id for m in check_consumers()} == {"dbworker.E207", "dbworker.E208"}


def test_admin_lists_and_resets(admin_client):
    row = ConsumerCheckpoint.objects.create(name="all_events", position=5, head=9)
    page = admin_client.get(reverse("admin:django_dbworker_consumercheckpoint_changelist"))
    assert b"all_events" in page.content
    assert b"Behind for" in page.content
    url = reverse("admin:django_dbworker_consumercheckpoint_changelist")
    data = {"action": "reset", "_selected_action": [row.pk]}
    assert b"Reset checkpoint" in admin_client.post(url, data).content
    admin_client.post(url, {**data, "position": 2})
    assert ConsumerCheckpoint.objects.get().position == 2
    assert AuditEntry.objects.get().detail == "5 → 2"
    assert connection.vendor in ("sqlite", "postgresql")
