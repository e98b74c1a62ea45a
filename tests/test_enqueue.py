"""bulk_enqueue: the fast documented way to enqueue many jobs."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.factories import RepositoryFactory
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db(transaction=True)


def test_bulk_enqueue_writes_domain_fields_and_database_defaults():
    repo = RepositoryFactory()
    later = timezone.now() + timedelta(hours=1)
    jobs = [
        QueueJob(repository=repo, behavior="fail", payload={"n": i, "s": "ü<'\"\t\\"}, priority=i)
        for i in range(25)
    ]
    jobs.append(QueueJob(process_after=later, state="failed", num_failures=7))
    before = timezone.now()
    assert QueueJob.objects.bulk_enqueue(iter(jobs), batch_size=10) == 26
    rows = list(QueueJob.objects.order_by("id"))
    assert [r.payload for r in rows[:25]] == [{"n": i, "s": "ü<'\"\t\\"} for i in range(25)]
    assert {r.repository_id for r in rows[:25]} == {repo.pk}
    assert [r.priority for r in rows[:25]] == list(range(25))
    last = rows[25]
    assert last.process_after == later
    # Bookkeeping columns other than process_after always start fresh.
    assert (last.state, last.num_failures, last.execution_logs) == ("queued", 0, [])
    assert all(r.queued_at >= before - timedelta(seconds=5) for r in rows)


def test_bulk_enqueued_jobs_run(run_worker):
    QueueJob.objects.bulk_enqueue(QueueJob() for _ in range(30))
    assert run_worker(h.BehaviorHandler(), burst=True).join() == 0
    assert QueueJob.objects.filter(state="completed").count() == 30


def test_bulk_enqueue_of_nothing():
    assert QueueJob.objects.bulk_enqueue([]) == 0
