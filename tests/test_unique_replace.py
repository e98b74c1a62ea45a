"""``enqueue_unique(on_conflict="replace")`` and fields of another unique constraint
(issue 42, item 22): they are written, not silently skipped, and a write that would
take a key another job holds is a clear ``IntegrityError`` that changes nothing."""

import pytest
from django.db import IntegrityError

from tests.testapp.models import ReportJob

pytestmark = pytest.mark.django_db

H1, H2 = "2026-11-23T10:00:00+00:00", "2026-11-23T11:00:00+00:00"


def test_replace_writes_a_field_of_another_unique_constraint():
    """ReportJob is unique per (tenant, kind) while active and per (tenant, hour) for
    good: the waiting job of (acme, hourly) takes the new hour and payload."""
    job, created = ReportJob.objects.enqueue_unique(tenant="acme", kind="hourly", hour=H1)
    assert created
    again, created = ReportJob.objects.enqueue_unique(
        tenant="acme", kind="hourly", hour=H2, payload={"v": 2}, on_conflict="replace"
    )
    assert (again.pk, created) == (job.pk, False)
    job.refresh_from_db()
    assert (job.hour, job.payload) == (H2, {"v": 2})
    assert (again.hour, again.payload) == (H2, {"v": 2})
    # The hour it gave up is free again, the one it took is held.
    _, created = ReportJob.objects.enqueue_unique(tenant="acme", kind="other", hour=H1)
    assert created
    _, created = ReportJob.objects.enqueue_unique(tenant="acme", kind="third", hour=H2)
    assert not created


def test_replace_that_would_take_a_held_key_is_a_clear_error_and_writes_nothing():
    waiting, _ = ReportJob.objects.enqueue_unique(tenant="acme", kind="hourly", hour=H1)
    done, _ = ReportJob.objects.enqueue_unique(tenant="acme", kind="daily", hour=H2)
    ReportJob.objects.filter(pk=done.pk).update(state="completed")  # holds H2 for good
    with pytest.raises(IntegrityError) as raised:
        ReportJob.objects.enqueue_unique(
            tenant="acme", kind="hourly", hour=H2, payload={"v": 2}, on_conflict="replace"
        )
    assert str(raised.value) == (
        f"enqueue_unique(on_conflict='replace'): writing hour to job {waiting.pk} would take "
        f"the key of testapp_report_hourly, which job {done.pk} holds; nothing was written"
    )
    waiting.refresh_from_db()
    assert (waiting.hour, waiting.payload) == (H1, {})
    assert ReportJob.objects.count() == 2


def test_replace_inside_a_transaction_that_fails_leaves_the_transaction_usable():
    from django.db import transaction

    ReportJob.objects.enqueue_unique(tenant="acme", kind="hourly", hour=H1)
    done, _ = ReportJob.objects.enqueue_unique(tenant="acme", kind="daily", hour=H2)
    ReportJob.objects.filter(pk=done.pk).update(state="completed")
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            ReportJob.objects.enqueue_unique(
                tenant="acme", kind="hourly", hour=H2, on_conflict="replace"
            )
        assert ReportJob.objects.count() == 2  # a savepoint: the transaction goes on
