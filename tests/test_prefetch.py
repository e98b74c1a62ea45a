"""prefetch: jobs claimed ahead of free handler threads, in batches."""

import pytest

from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import Event, QueueJob

pytestmark = pytest.mark.django_db(transaction=True)


def test_prefetch_claims_in_batches_and_runs_every_job_once(run_worker):
    JobFactory.create_batch(60)
    tw = run_worker(h.BehaviorHandler(num_handlers=2, prefetch=8), burst=True)
    assert tw.join() == 0
    assert set(QueueJob.objects.values_list("state", flat=True)) == {"completed"}
    assert Event.objects.filter(kind="start").count() == 60


def test_a_job_never_holds_more_than_handlers_plus_prefetch(run_worker):
    JobFactory.create_batch(20, behavior="sleep", payload={"seconds": 2})
    tw = run_worker(h.BehaviorHandler(num_handlers=2, prefetch=3))
    wait_until(lambda: QueueJob.objects.filter(state="processing").count() == 5, 10)
    assert Event.objects.filter(kind="start").count() <= 2
    tw.stop()  # drain: the 3 waiting jobs go back unrun, the 2 running ones finish
    assert tw.join() == 0
    states = list(QueueJob.objects.values_list("state", flat=True))
    assert states.count("completed") == 2
    assert states.count("queued") == 18
    assert Event.objects.filter(kind="start").count() == 2


def test_prefetch_is_validated():
    from django_dbworker.checks import validate_handler

    assert [m.id for m in validate_handler(h.BehaviorHandler(prefetch=-1))] == ["dbworker.E004"]
