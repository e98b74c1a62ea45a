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


def test_bulk_enqueue_of_mappings_writes_what_the_instances_would():
    """A mapping of field values is the job ``QueueJob(**values)`` would be: related
    objects or their keys, defaults (a callable one called for each job), and the
    instances the ``jobs_enqueued`` signal gets carry the values."""
    from django_dbworker import signals

    repo = RepositoryFactory()
    later = timezone.now() + timedelta(hours=1)
    seen = []

    def receiver(sender, jobs, **kwargs):
        seen.extend((type(job), job.behavior, job.payload) for job in jobs)

    signals.jobs_enqueued.connect(receiver, sender=QueueJob)
    try:
        count = QueueJob.objects.bulk_enqueue(
            [
                {"repository": repo, "behavior": "fail", "payload": {"s": "ü<'\"\t\\"}},
                {"repository_id": repo.pk, "priority": 3},
                {"process_after": later},
                {},
            ],
            batch_size=3,
        )
    finally:
        signals.jobs_enqueued.disconnect(receiver, sender=QueueJob)
    assert count == 4
    rows = list(QueueJob.objects.order_by("id"))
    assert [(r.repository_id, r.behavior, r.priority) for r in rows] == [
        (repo.pk, "fail", 0),
        (repo.pk, "ok", 3),
        (None, "ok", 0),
        (None, "ok", 0),
    ]
    assert [r.payload for r in rows] == [{"s": "ü<'\"\t\\"}, {}, {}, {}]
    assert rows[2].process_after == later
    assert {(r.state, r.num_failures) for r in rows} == {("queued", 0)}
    assert seen[0] == (QueueJob, "fail", {"s": "ü<'\"\t\\"})
    assert len(seen) == 4
    # A callable default is called for each job: no two share one dict.
    assert len({id(payload) for _, _, payload in seen[1:]}) == 3


def test_bulk_enqueue_of_mappings_keeps_uuid_keys_and_every_kind_of_default():
    from tests.testapp.models import UUIDJob

    before = timezone.now()
    assert UUIDJob.objects.bulk_enqueue([{"behavior": "ok"}, {}, {"token": "mine"}]) == 3
    rows = list(UUIDJob.objects.all())
    assert len({row.pk for row in rows}) == 3
    assert all(row.created_at >= before - timedelta(seconds=1) for row in rows)  # auto_now_add
    assert all(row.source == "database" for row in rows)  # db_default
    assert sorted(len(row.token) for row in rows) == [4, 32, 32]  # a callable default


def test_bulk_enqueue_refuses_what_is_not_a_job_and_writes_nothing():
    with pytest.raises(TypeError, match="unexpected keyword"):
        QueueJob.objects.bulk_enqueue([{"behavior": "ok"}, {"colour": "red"}])
    with pytest.raises(TypeError, match="QueueJob instances or mappings"):
        QueueJob.objects.bulk_enqueue([{"behavior": "ok"}, 7])
    assert not QueueJob.objects.exists()


def test_bulk_enqueue_of_mappings_runs_init_where_someone_listens():
    """A ``post_init`` receiver (or an ``__init__`` of the model's own) sees each job
    built, as with ``QueueJob(**values)``."""
    from django.db.models.signals import post_init

    built = []

    def receiver(sender, instance, **kwargs):
        built.append(instance.behavior)

    post_init.connect(receiver, sender=QueueJob)
    try:
        QueueJob.objects.bulk_enqueue([{"behavior": "a"}, {"behavior": "b"}])
    finally:
        post_init.disconnect(receiver, sender=QueueJob)
    assert built == ["a", "b"]
    assert sorted(QueueJob.objects.values_list("behavior", flat=True)) == ["a", "b"]


def test_bulk_enqueue_prepares_each_value_as_django_would():
    """``bulk_enqueue`` prepares a repeated value once (``django_dbworker.bulk``): the
    rows are still Django's own, value by value, whatever the values' types (1, 1.0
    and True are equal keys in a dict, and a text column writes "1", "1.0", "True")."""
    from django.db import connection

    from django_dbworker.bulk import Rows

    later = timezone.now() + timedelta(hours=1)
    fields = [QueueJob._meta.get_field(n) for n in ("behavior", "priority", "process_after")]
    values = [1, True, 1.0, "1", None, "ü", 1, True, 1.0]
    jobs = [
        QueueJob(behavior=v, priority=i % 3, process_after=later if i % 2 else None)
        for i, v in enumerate(values)
    ]
    rows = Rows(fields, connection)
    for job in jobs:
        expected = [f.get_db_prep_save(f.pre_save(job, add=True), connection) for f in fields]
        assert rows.of(job) == (tuple(fields), expected)
    QueueJob.objects.bulk_enqueue({"behavior": v} for v in values if v is not None)
    assert list(QueueJob.objects.order_by("id").values_list("behavior", flat=True)) == [
        "1",
        "True",
        "1.0",
        "1",
        "ü",
        "1",
        "True",
        "1.0",
    ]
