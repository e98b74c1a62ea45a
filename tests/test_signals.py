"""Lifecycle signals and the per-minute statistics (issue 14), with real workers on
SQLite and PostgreSQL."""

import threading
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from django_dbworker import signals
from django_dbworker.maintenance.resetter import Resetter
from django_dbworker.runtime.worker import Worker
from django_dbworker.stats import DURATION_BUCKETS, JobStats, merged, percentile
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db(transaction=True)

ALL = [
    "worker_started",
    "worker_stopping",
    "worker_stopped",
    "job_claimed",
    "job_started",
    "job_finished",
    "job_reset",
    "job_canceled",
]


@pytest.fixture
def heard():
    """Every signal sent, in order: (name, sender, arguments, thread name)."""
    events = []
    lock = threading.Lock()

    def listener(name):
        def receive(sender, **kwargs):
            kwargs.pop("signal")
            with lock:
                events.append((name, sender, kwargs, threading.current_thread().name))

        return receive

    receivers = {name: listener(name) for name in ALL}
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    yield events
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def of_job(events, pk):
    return [(name, args) for name, _, args, _ in events if getattr(args.get("job"), "pk", 0) == pk]


def test_signals_of_a_job_and_a_worker_in_order(run_worker, heard):
    ok = JobFactory(behavior="ok")
    bad = JobFactory(behavior="nonretryable")
    tw = run_worker(h.BehaviorHandler())
    wait_until(lambda: QueueJob.objects.filter(state__in=["completed", "failed"]).count() == 2)
    assert tw.stop() == 0
    names = [name for name, *_ in heard]
    assert names[0] == "worker_started"
    assert names[-2:] == ["worker_stopping", "worker_stopped"]
    for job, state in ((ok, "completed"), (bad, "failed")):
        steps = of_job(heard, job.pk)
        assert [name for name, _ in steps] == ["job_claimed", "job_started", "job_finished"]
        finished = steps[-1][1]
        assert finished["outcome"].state == state
        assert finished["attempt"].pk == job.pk
        assert isinstance(finished["handler"], h.BehaviorHandler)
    threads = {name: thread for name, _, _, thread in heard}
    assert threads["job_claimed"] == threads["worker_started"] == "test-worker"
    assert threads["job_started"].startswith("dbworker-")
    assert threads["job_finished"] == "dbworker-writer"
    started = next(args for name, _, args, _ in heard if name == "worker_started")
    assert started["handlers"] == [h.BehaviorHandler().get_name()]
    stopped = heard[-1][2]
    assert stopped["exit_code"] == 0
    assert stopped["outcomes"] == {"completed": 1, "failed": 1}
    assert all(sender is QueueJob for name, sender, _, _ in heard if name.startswith("job_"))
    assert all(sender is Worker for name, sender, _, _ in heard if name.startswith("worker_"))


def test_job_canceled_comes_from_the_heartbeat(run_worker, heard):
    job = JobFactory(behavior="sleep", payload={"seconds": 30})
    tw = run_worker(h.BehaviorHandler())
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "processing")
    QueueJob.objects.filter(pk=job.pk).cancel()
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "canceled")
    assert tw.stop() == 0
    steps = [name for name, _ in of_job(heard, job.pk)]
    assert steps == ["job_claimed", "job_started", "job_canceled", "job_finished"]
    [thread] = {t for name, _, _, t in heard if name == "job_canceled"}
    assert thread == "dbworker-heartbeat"


def test_signals_of_an_async_handler(run_worker, heard):
    job = JobFactory(behavior="ok")
    tw = run_worker(h.AsyncOrmHandler())
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "completed")
    assert tw.stop() == 0
    steps = of_job(heard, job.pk)
    assert [name for name, _ in steps] == ["job_claimed", "job_started", "job_finished"]
    assert steps[-1][1]["outcome"].state == "completed"


def test_a_failing_receiver_never_breaks_the_worker(run_worker, caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver broke")

    signals.job_started.connect(broken)
    signals.job_finished.connect(broken)
    try:
        jobs = JobFactory.create_batch(3)
        tw = run_worker(h.BehaviorHandler())
        wait_until(lambda: QueueJob.objects.filter(state="completed").count() == 3)
        assert tw.stop() == 0
    finally:
        signals.job_started.disconnect(broken)
        signals.job_finished.disconnect(broken)
    failures = [r for r in caplog.records if r.name == "django_dbworker.signals"]
    assert len(failures) == 2 * len(jobs)
    assert "receiver broke" in failures[0].getMessage()


def test_job_reset_from_the_resetter(heard):
    old = timezone.now() - timedelta(minutes=5)
    stalled = JobFactory(state="processing", worker_hostname="gone:1:a", last_heartbeat_at=old)
    spent = JobFactory(
        state="processing", worker_hostname="gone:2:b", last_heartbeat_at=old, num_resets=2
    )
    resetter = Resetter([h.BehaviorHandler()])  # max_num_resets = 2
    try:
        resetter.run_once()
    finally:
        resetter.close()
    resets = {args["job_id"]: args for name, _, args, _ in heard if name == "job_reset"}
    assert resets == {
        stalled.pk: {
            "job_id": stalled.pk,
            "worker_id": "gone:1:a",
            "failed": False,
            "superseded": False,
        },
        spent.pk: {
            "job_id": spent.pk,
            "worker_id": "gone:2:b",
            "failed": True,
            "superseded": False,
        },
    }


# -- the per-minute statistics --------------------------------------------------------


def test_workers_write_what_they_finished_per_minute(run_worker):
    JobFactory.create_batch(5, behavior="ok")
    JobFactory.create_batch(2, behavior="nonretryable")
    JobFactory(behavior="sleep", payload={"seconds": 0.3})
    tw = run_worker(h.BehaviorHandler())
    wait_until(lambda: QueueJob.objects.filter(state__in=["completed", "failed"]).count() == 8)
    assert tw.stop() == 0  # the writer writes its statistics when it stops
    rows = JobStats.objects.filter(handler=h.BehaviorHandler().get_name())
    totals = rows.aggregate(Sum("completed"), Sum("failed"), Sum("errored"))
    assert totals == {"completed__sum": 6, "failed__sum": 2, "errored__sum": 0}
    assert {r.worker for r in rows} == {tw.worker.worker_id}
    assert {r.model for r in rows} == {"testapp.QueueJob"}
    histogram = merged(r.durations for r in rows)
    assert sum(histogram) == 8
    assert percentile(histogram, 1.0) >= 0.25  # the 0.3 s job
    assert sum(r.duration_sum for r in rows) >= 0.3


def test_an_idle_worker_writes_its_statistics_within_a_second_or_so(run_worker):
    """The writer writes the figures when it runs out of outcomes, at most every
    ``IDLE_FLUSH_AFTER`` seconds (a drain goes idle between claims): they reach the
    table while the worker runs on, not only when it stops."""
    JobFactory.create_batch(3, behavior="ok")
    tw = run_worker(h.BehaviorHandler())
    rows = JobStats.objects.filter(handler=h.BehaviorHandler().get_name())
    wait_until(lambda: (rows.aggregate(Sum("completed"))["completed__sum"] or 0) == 3, timeout=10)
    JobFactory.create_batch(2, behavior="ok")  # after a write: the next waits its turn
    wait_until(lambda: rows.aggregate(Sum("completed"))["completed__sum"] == 5, timeout=10)
    assert tw.stop() == 0


def test_percentiles_from_histograms():
    histogram = [0] * (len(DURATION_BUCKETS) + 1)
    histogram[DURATION_BUCKETS.index(0.01)] = 90  # (0.005, 0.01]
    histogram[DURATION_BUCKETS.index(1.0)] = 10  # (0.5, 1]
    assert percentile(histogram, 0.5) == pytest.approx(0.005 + 0.005 * 50 / 90)
    assert 0.5 < percentile(histogram, 0.95) <= 1.0
    assert percentile([0] * len(histogram), 0.5) is None
    assert merged([[1, 2], [3]])[:2] == [4, 2]
