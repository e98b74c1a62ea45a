"""The worker run in a thread of the test process, against the real database."""

import itertools
import json
import logging
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbworker.exceptions import CancelReason
from tests.conftest import wait_until
from tests.factories import JobFactory, RepositoryFactory
from tests.testapp import handlers as h
from tests.testapp.models import Event, QueueJob

pytestmark = pytest.mark.django_db(transaction=True)


def states():
    return dict(QueueJob.objects.values_list("pk", "state"))


def kinds(job):
    return list(Event.objects.filter(job_id=job.pk).values_list("kind", flat=True))


def test_burst_runs_every_job_to_completion(run_worker):
    jobs = JobFactory.create_batch(20)
    assert run_worker(h.BehaviorHandler(), burst=True).join() == 0
    assert set(states().values()) == {"completed"}
    for job in jobs:
        job.refresh_from_db()
        assert job.finished_at >= job.started_at
        assert job.worker_hostname
    # One attempt each: start/end recorded once per job.
    assert Event.objects.filter(kind="start").count() == 20


def test_every_completed_job_is_logged_once_alone_or_in_a_group(run_worker, caplog):
    """One INFO line per completion statement: the job alone, or every job it completed."""
    caplog.set_level(logging.INFO, logger="django_dbworker.writer")
    jobs = JobFactory.create_batch(60)
    run_worker(h.BehaviorHandler(num_handlers=8, prefetch=8), burst=True).join()
    logged = []
    for record in caplog.records:
        if "completed in" in record.getMessage():
            logged += getattr(record, "job_ids", None) or [record.job_id]
    assert sorted(logged) == sorted(job.pk for job in jobs)
    for record in caplog.records:
        if hasattr(record, "job_ids"):
            expected = f"{len(record.job_ids)} jobs of testapp.QueueJob completed"
            assert expected in record.getMessage()


class OrmHandler(h.BehaviorHandler):
    """Uses the ORM in its handler thread, and notes whether a connection was open
    when each job began."""

    def __init__(self, **options):
        super().__init__(**options)
        self.open_at_start = []

    def handle(self, job):
        from django.db import connection

        self.open_at_start.append(connection.connection is not None)
        assert QueueJob.objects.filter(pk=job.pk).exists()


def test_a_handler_threads_orm_connection_is_closed_after_each_job(run_worker):
    """Like a request: with CONN_MAX_AGE = 0 no job inherits the previous one's connection."""
    JobFactory.create_batch(5)
    handler = OrmHandler(num_handlers=1)
    assert run_worker(handler, burst=True).join() == 0
    assert set(states().values()) == {"completed"}
    assert handler.open_at_start == [False] * 5


def test_retries_until_success(run_worker):
    job = JobFactory(behavior="fail_times", payload={"times": 2})
    run_worker(h.BehaviorHandler(max_num_retries=2), burst=True).join()
    job.refresh_from_db()
    assert (job.state, job.num_failures) == ("completed", 2)
    assert kinds(job).count("start") == 3


def test_retry_budget_spent_fails_the_job(run_worker):
    job = JobFactory(behavior="fail")
    run_worker(h.BehaviorHandler(max_num_retries=1), burst=True).join()
    job.refresh_from_db()
    assert (job.state, job.num_failures) == ("failed", 2)
    assert job.failure_message.startswith("RuntimeError: boom")
    assert "Traceback" in job.failure_message


class BudgetPerJob(h.BehaviorHandler):
    """A retry budget read from the job's own column (``payload``)."""

    max_num_retries = 5  # at least the largest budget: claims take errored jobs up to it

    def retry_budget(self, job):
        return job.payload["retries"]


def test_a_retry_budget_read_from_the_users_columns_is_each_jobs(run_worker):
    """Retry x user-defined fields: ``retry_budget(job)`` reads the job's own fields."""
    none = JobFactory(behavior="fail", payload={"retries": 0})
    two = JobFactory(behavior="fail", payload={"retries": 2})
    assert run_worker(BudgetPerJob(), burst=True).join() == 0
    for job, failures in ((none, 1), (two, 3)):
        job.refresh_from_db()
        assert (job.state, job.num_failures) == ("failed", failures)
        assert kinds(job).count("start") == failures


def test_retry_waits_retry_after_with_exponential_backoff(run_worker):
    job = JobFactory(behavior="fail")
    handler = h.BehaviorHandler(
        max_num_retries=5, retry_after=100, retry_backoff=2, retry_max_delay=150
    )
    assert handler.retry_delay(1) == 100
    assert handler.retry_delay(2) == 150  # 200 capped
    run_worker(handler, burst=True).join()
    job.refresh_from_db()
    assert (job.state, job.num_failures) == ("errored", 1)
    delay = (job.process_after - job.finished_at).total_seconds()
    assert 99 <= delay <= 101


def test_non_retryable_error_fails_at_once(run_worker):
    job = JobFactory(behavior="nonretryable")
    run_worker(h.BehaviorHandler(max_num_retries=5), burst=True).join()
    job.refresh_from_db()
    assert (job.state, job.num_failures) == ("failed", 1)
    assert "NonRetryableError: bad input" in job.failure_message


def test_cancel_flag_stops_a_running_job(run_worker):
    job = JobFactory(behavior="sleep", payload={"seconds": 30})
    tw = run_worker(h.BehaviorHandler())
    wait_until(lambda: QueueJob.objects.filter(pk=job.pk, state="processing").exists())
    QueueJob.objects.filter(pk=job.pk).update(cancel=True)
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "canceled", timeout=10)
    job.refresh_from_db()
    assert job.num_failures == 0
    # post_handle runs once the outcome is written, and sees what was written.
    wait_until(lambda: "post_handle:canceled" in kinds(job), timeout=10)
    tw.stop()


def test_a_queued_job_with_cancel_set_is_canceled_without_running(run_worker):
    job = JobFactory(cancel=True)
    run_worker(h.BehaviorHandler(), burst=True).join()
    job.refresh_from_db()
    assert job.state == "canceled"
    assert kinds(job) == []


def test_deleted_row_stops_the_handler_and_writes_nothing(run_worker):
    job = JobFactory(behavior="sleep", payload={"seconds": 30})
    tw = run_worker(h.BehaviorHandler())
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="start").exists())
    QueueJob.objects.filter(pk=job.pk).delete()
    wait_until(lambda: "post_handle:lost" in kinds(job), timeout=10)
    assert not QueueJob.objects.filter(pk=job.pk).exists()
    assert tw.stop() == 0


def test_maximum_runtime_errors_the_job(run_worker):
    job = JobFactory(behavior="sleep", payload={"seconds": 30})
    run_worker(h.TimeoutHandler(), burst=True).join()
    job.refresh_from_db()
    assert job.state == "failed"
    assert "exceeded the maximum runtime of 0.5s" in job.failure_message


def test_interrupt_on_cancel_stops_a_busy_loop(run_worker):
    job = JobFactory(behavior="spin", payload={"seconds": 60})
    tw = run_worker(h.InterruptingHandler())
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="start").exists())
    started = time.monotonic()
    QueueJob.objects.filter(pk=job.pk).update(cancel=True)
    wait_until(lambda: QueueJob.objects.get(pk=job.pk).state == "canceled", timeout=10)
    assert time.monotonic() - started < 10
    tw.stop()


def test_hooks_run_in_order_and_post_handle_sees_the_outcome(run_worker):
    ok = JobFactory()
    bad = JobFactory(behavior="nonretryable")
    run_worker(h.BehaviorHandler(), burst=True).join()
    assert kinds(ok) == ["start", "end", "post_handle:completed"]
    assert kinds(bad) == ["start", "end", "post_handle:failed"]


def test_hook_errors_fail_the_attempt_or_are_logged_never_kill_the_worker(run_worker, caplog):
    pre = JobFactory(behavior="pre_handle_raises")
    post = JobFactory(behavior="post_handle_raises")
    assert run_worker(h.BehaviorHandler(max_num_retries=0), burst=True).join() == 0
    pre.refresh_from_db()
    post.refresh_from_db()
    assert pre.state == "failed"
    assert "pre_handle broke" in pre.failure_message
    assert kinds(pre) == ["post_handle:failed"]  # handle never ran
    assert post.state == "completed"
    assert "post_handle raised" in caplog.text


def test_unexpected_return_values(run_worker, caplog):
    value = JobFactory(behavior="return_value")
    exc = JobFactory(behavior="return_exception")
    run_worker(h.BehaviorHandler(max_num_retries=0), burst=True).join()
    value.refresh_from_db()
    exc.refresh_from_db()
    assert value.state == "completed"
    assert "return values are ignored" in caplog.text
    assert exc.state == "failed"
    assert "returned, not raised" in exc.failure_message


def test_malformed_payload_fails_only_that_job(run_worker):
    bad = JobFactory(behavior="parse", payload={"raw": "{not json"})
    good = JobFactory(behavior="parse", payload={"raw": "{}"})
    run_worker(h.BehaviorHandler(max_num_retries=0), burst=True).join()
    assert states() == {bad.pk: "failed", good.pk: "completed"}


def test_execution_log_is_written_live_and_kept(run_worker):
    job = JobFactory(behavior="log")
    run_worker(h.BehaviorHandler(), burst=True).join()
    job.refresh_from_db()
    first, second = job.execution_logs
    assert first["key"] == "step-1"
    assert first["command"] == ["echo", "hello"]
    assert first["out"] == "hello\n"
    assert first["exit_code"] == 0
    assert first["duration_ms"] is not None
    assert first["start_time"]
    assert second["exit_code"] == 1
    assert second["out"] == "<script>alert(1)</script>"


def test_huge_messages_and_non_utf8_output_are_capped_and_cleaned(run_worker, settings):
    settings.DBWORKER = {"MAX_FAILURE_MESSAGE_LENGTH": 1000, "MAX_LOG_OUTPUT_LENGTH": 200}
    huge = JobFactory(behavior="huge_error")
    binary = JobFactory(behavior="binary_output")
    run_worker(h.BehaviorHandler(max_num_retries=0), burst=True).join()
    huge.refresh_from_db()
    binary.refresh_from_db()
    assert len(huge.failure_message) < 1100
    assert "more characters cut" in huge.failure_message
    [entry] = binary.execution_logs
    assert entry["out"] == "ok \ufffd\ufffd\ufffd end"


def test_pre_dequeue_budget_limits_concurrent_size(run_worker):
    for size in (2, 2, 1, 1, 3, 1):
        JobFactory(behavior="sleep", payload={"seconds": 0.2}, size=size)
    handler = h.BudgetHandler(num_handlers=4)
    run_worker(handler, burst=True).join()
    assert set(states().values()) == {"completed"}
    assert handler.peak <= handler.capacity


@pytest.mark.parametrize(
    "handler_cls", [h.NotNowHandler, h.BadPreDequeueHandler, h.RaisingPreDequeueHandler]
)
def test_pre_dequeue_saying_no_or_misbehaving_claims_nothing(run_worker, handler_cls, caplog):
    job = JobFactory()
    tw = run_worker(handler_cls(interval=0.05))
    time.sleep(0.5)
    assert tw.stop() == 0
    job.refresh_from_db()
    assert job.state == "queued"
    if handler_cls is h.BadPreDequeueHandler:
        assert "pre_dequeue returned 42" in caplog.text


def test_dequeue_filter_on_own_and_related_columns(run_worker):
    wanted = RepositoryFactory(name="wanted")
    other = RepositoryFactory(name="other")
    ok = JobFactory(behavior="ok", repository=other)
    skipped = JobFactory(behavior="fail", repository=wanted)
    run_worker(h.FilteredHandler(), burst=True).join()
    assert states() == {ok.pk: "completed", skipped.pk: "queued"}
    run_worker(h.RelatedFilterHandler(), burst=True).join()
    assert QueueJob.objects.get(pk=skipped.pk).state == "failed"


def test_priority_ordering(run_worker):
    low = JobFactory(priority=1)
    high = JobFactory(priority=9)
    run_worker(h.PriorityHandler(), burst=True).join()
    starts = list(Event.objects.filter(kind="start").values_list("job_id", flat=True))
    assert starts == [high.pk, low.pk]


def test_get_queryset_eager_loads(run_worker, django_assert_max_num_queries):
    repo = RepositoryFactory()
    job = JobFactory(repository=repo)
    run_worker(h.EagerHandler(), burst=True).join()
    job.refresh_from_db()
    assert job.state == "completed"


def test_max_jobs_stops_after_that_many(run_worker):
    JobFactory.create_batch(10)
    run_worker(h.BehaviorHandler(num_handlers=2), max_jobs=3).join()
    assert list(states().values()).count("completed") == 3
    assert list(states().values()).count("queued") == 7


def test_max_time_stops_claiming(run_worker):
    JobFactory(behavior="sleep", payload={"seconds": 0.1})
    started = time.monotonic()
    run_worker(h.BehaviorHandler(), max_time=0.5).join()
    assert time.monotonic() - started < 5


def test_two_workers_never_run_the_same_job(run_worker):
    """Both claim, none twice. (On MariaDB a claim that sorted its rows once locked every
    claimable row it read, and the second worker found the queue empty.)"""
    JobFactory.create_batch(200, behavior="ok")
    a = run_worker(h.BehaviorHandler(num_handlers=3), burst=True)
    b = run_worker(h.BehaviorHandler(num_handlers=3), burst=True)
    a.join(60)
    b.join(60)
    assert set(states().values()) == {"completed"}
    starts = list(Event.objects.filter(kind="start").values_list("job_id", flat=True))
    assert len(starts) == 200 == len(set(starts))
    assert len(set(Event.objects.values_list("worker", flat=True)) - {""}) == 2


def test_stop_drains_running_jobs(run_worker):
    job = JobFactory(behavior="sleep", payload={"seconds": 1})
    tw = run_worker(h.BehaviorHandler(), shutdown_timeout=10)
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="start").exists())
    assert tw.stop() == 0
    job.refresh_from_db()
    assert job.state == "completed"


def test_forced_stop_requeues_cooperative_jobs(run_worker):
    job = JobFactory(behavior="sleep", payload={"seconds": 60})
    tw = run_worker(h.BehaviorHandler(), shutdown_timeout=0.2)
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="start").exists())
    assert tw.stop() == 0
    job.refresh_from_db()
    assert (job.state, job.num_resets, job.num_failures) == ("queued", 0, 0)


def test_the_worker_never_resets_its_own_live_jobs(run_worker, settings):
    """The resetter inside a worker spares its jobs even if their heartbeat looks old."""
    job = JobFactory(behavior="sleep", payload={"seconds": 1.5})
    handler = h.SlowHeartbeatHandler(stalled_max_age=0.1, heartbeat_interval=5)
    tw = run_worker(handler)
    wait_until(lambda: Event.objects.filter(job_id=job.pk, kind="end").exists(), timeout=10)
    tw.stop()
    job.refresh_from_db()
    assert (job.state, job.num_resets) == ("completed", 0)


def test_cancel_reasons_are_exposed_to_handlers():
    assert {r.value for r in CancelReason} == {
        "canceled",
        "lost",
        "timeout",
        "shutdown",
        "no heartbeat",
    }


def test_process_after_in_the_past_is_claimed(run_worker):
    job = JobFactory(process_after=timezone.now() - timedelta(seconds=1))
    run_worker(h.BehaviorHandler(), burst=True).join()
    job.refresh_from_db()
    assert job.state == "completed"


def test_a_worker_runs_one_reset_job_at_a_time(run_worker, caplog):
    """A reset job may be what crashed its last worker: it never shares a process with
    another reset job, so a poison job takes each neighbour down once at most."""
    caplog.set_level(logging.INFO, logger="django_dbworker")
    suspects = JobFactory.create_batch(3, behavior="sleep", payload={"seconds": 0.3}, num_resets=1)
    fresh = JobFactory.create_batch(3, behavior="sleep", payload={"seconds": 0.3})
    run_worker(h.BehaviorHandler(num_handlers=4), burst=True).join()
    assert set(states().values()) == {"completed"}
    spans = {}
    for event in Event.objects.filter(kind__in=["start", "end"]):
        spans.setdefault(event.job_id, []).append(event.at)
    suspect_spans = sorted(spans[job.pk] for job in suspects)
    for (_, end), (start, _) in itertools.pairwise(suspect_spans):
        assert end <= start, "two reset jobs ran at once in one worker"
    # Fresh jobs ran alongside them.
    assert min(spans[job.pk][0] for job in fresh) < suspect_spans[0][1]
    assert {QueueJob.objects.get(pk=job.pk).num_resets for job in suspects} == {1}
    assert "given back: this worker runs a reset job" in caplog.text


def test_resetter_leaves_jobs_alone_for_stalled_max_age_after_a_database_error():
    from django_dbworker.maintenance.resetter import Resetter

    job = JobFactory(state="processing", last_heartbeat_at=timezone.now() - timedelta(minutes=1))
    resetter = Resetter([h.BehaviorHandler(stalled_max_age=0.5)])
    try:
        resetter.note_failure()
        [report] = resetter.run_once()
        assert (report.held_back, report.reset) == (True, [])
        assert QueueJob.objects.get(pk=job.pk).state == "processing"
        time.sleep(0.6)
        [report] = resetter.run_once()
        assert (report.held_back, report.reset) == (False, [job.pk])
    finally:
        resetter.close()


def test_a_hook_raising_system_exit_does_not_cost_a_handler_thread(run_worker):
    """post_handle raising SystemExit (a BaseException) ended the only handler thread:
    every later job was claimed, held and heartbeated forever, never run."""
    jobs = [JobFactory(behavior="post_handle_exits") for _ in range(2)] + JobFactory.create_batch(3)
    assert run_worker(h.BehaviorHandler(num_handlers=1), burst=True).join(30) == 0
    assert set(states().values()) == {"completed"}
    assert len(jobs) == 5


def test_an_exception_whose_str_raises_fails_the_job_with_a_message(run_worker):
    bad = JobFactory(behavior="bad_str")
    ok = JobFactory()
    assert (
        run_worker(h.BehaviorHandler(num_handlers=1, max_num_retries=0), burst=True).join(30) == 0
    )
    bad.refresh_from_db()
    assert (bad.state, bad.num_resets) == ("failed", 0)
    assert bad.failure_message.startswith("UnprintableError: <str() failed: RuntimeError")
    assert QueueJob.objects.get(pk=ok.pk).state == "completed"


def test_get_queryset_raising_errors_the_claimed_jobs_and_loses_none(run_worker, caplog):
    """The claim had already marked the rows processing: they get an outcome at once (not
    the resetter's), and a broken get_queryset() is an error of the attempt, retried as
    usual. Running the plain rows instead would hand handle() jobs without what its
    queryset adds (annotations, eager loads)."""
    JobFactory.create_batch(3)
    assert run_worker(h.BrokenQuerysetHandler(), burst=True).join(30) == 0
    assert set(states().values()) == {"failed"}
    for job in QueueJob.objects.all():
        assert (job.num_resets, job.num_failures) == (0, 3)
        assert job.failure_message.startswith("get_queryset() raised: RuntimeError")
    assert not Event.objects.filter(kind="start").exists()
    assert "get_queryset() raised" in caplog.text


def test_pre_dequeue_returning_an_invalid_q_claims_nothing_and_says_why(run_worker, caplog):
    job = JobFactory()
    tw = run_worker(h.BadDynamicFilterHandler(interval=0.05))
    time.sleep(0.5)
    assert tw.stop() == 0
    assert QueueJob.objects.get(pk=job.pk).state == "queued"
    assert "pre_dequeue returned a Q that cannot be used" in caplog.text
    assert "no_such_field" in caplog.text
    assert "database error" not in caplog.text


class StrictDecoder(json.JSONDecoder):
    """A JSONField decoder that refuses some values (Django only tolerates JSONDecodeError),
    as encrypted or versioned fields refuse rows they cannot read."""

    def decode(self, s, *args, **kwargs):
        value = super().decode(s, *args, **kwargs)
        if isinstance(value, dict) and value.get("version") == 0:
            raise ValueError("payload version 0 is no longer supported")
        return value


def test_a_row_that_cannot_be_loaded_fails_that_job_only(run_worker, monkeypatch):
    """The claim had already marked the row (and its batch) processing: the row must get
    an outcome, and its batch must run."""
    bad = JobFactory(payload={"version": 0})
    good = JobFactory.create_batch(3)
    monkeypatch.setattr(QueueJob._meta.get_field("payload"), "decoder", StrictDecoder)
    assert run_worker(h.BehaviorHandler(max_num_retries=0), burst=True).join(30) == 0
    rows = dict(QueueJob.objects.values_list("pk", "state").filter(pk__in=[j.pk for j in good]))
    assert set(rows.values()) == {"completed"}
    state, resets, message = QueueJob.objects.filter(pk=bad.pk).values_list(
        "state", "num_resets", "failure_message"
    )[0]
    assert (state, resets) == ("failed", 0)
    assert message.startswith("could not load the job row: ValueError: payload version 0")


@pytest.mark.parametrize(
    ("contended", "level", "says"),
    [
        (False, "WARNING", "the database failed"),
        (True, "INFO", "a statement waited over a second for SQLite's write lock"),
    ],
)
def test_the_resetter_says_why_it_holds_back(caplog, contended, level, says):
    """Four SQLite processes contend for the write lock as a matter of course: that was
    logged as "the database failed 2.9 s ago" when nothing failed."""
    from django_dbworker.maintenance.resetter import Resetter

    JobFactory(state="processing", last_heartbeat_at=timezone.now() - timedelta(minutes=1))
    resetter = Resetter([h.BehaviorHandler(stalled_max_age=30)])
    try:
        resetter.note_failure(contended=contended)
        [report] = resetter.run_once()
        assert report.held_back
    finally:
        resetter.close()
    [record] = [r for r in caplog.records if "no job is reset until" in r.getMessage()]
    assert record.levelname == level
    assert says in record.getMessage()


@pytest.mark.parametrize("behavior", ["ok", "fail"])
def test_an_outcome_whose_reply_was_lost_counts_as_written(run_worker, caplog, behavior):
    """The outcome's statement committed, then the connection broke before its reply:
    the writer tried again, found the row no longer processing, and told the outcome
    "refused, the job was reset or deleted meanwhile" (post_handle and job_finished
    saw it lost, task_finished was not sent) though it had landed."""
    from django.db import OperationalError

    tw = run_worker(h.BehaviorHandler(max_num_retries=0), install_signal_handlers=False)
    completer = tw.worker.writer.completer
    write, lost = completer.write, []

    def write_losing_its_first_reply(conn, *args, **kwargs):
        written = write(conn, *args, **kwargs)
        if written.states and not lost:
            lost.append(list(written.states))
            conn.lost = True  # as a broken connection leaves it
            raise OperationalError("server closed the connection unexpectedly")
        return written

    completer.write = write_losing_its_first_reply
    jobs = JobFactory.create_batch(2, behavior=behavior)
    final = "completed" if behavior == "ok" else "failed"
    with caplog.at_level(logging.INFO, "django_dbworker"):
        wait_until(lambda: set(states().values()) == {final}, 20, message="the jobs")
        wait_until(lambda: sum(tw.worker.writer.counts.values()) == len(jobs), 20)
    assert lost
    assert dict(tw.worker.writer.counts) == {final: len(jobs)}
    assert "refused" not in caplog.text


def test_a_claim_whose_reply_was_lost_is_requeued_unrun(run_worker, caplog):
    """A connection that breaks while a claim's reply is on its way (a pooler restarting
    behind a committed claim) left the rows processing for a live worker that never
    held them: after stalled_max_age the resetter took them, each spending a reset."""
    from django.db import OperationalError

    tw = run_worker(h.BehaviorHandler(), install_signal_handlers=False)
    lane = tw.worker.lanes[0]
    run, lost = lane.claimer.run, []

    def claim_losing_its_first_reply(conn, *args, **kwargs):
        rows = run(conn, *args, **kwargs)
        if rows and not lost:
            lost.append([row[0] for row in rows])
            conn.lost = True  # as a broken connection leaves it
            raise OperationalError("server closed the connection unexpectedly")
        return rows

    lane.claimer.run = claim_losing_its_first_reply
    jobs = JobFactory.create_batch(3)  # after the patch: a claim before it lost nothing
    with caplog.at_level(logging.INFO, "django_dbworker.lane"):
        wait_until(lambda: set(states().values()) == {"completed"}, 20, message="the jobs")
    assert lost
    for job in jobs:
        job.refresh_from_db()
        assert job.num_resets == 0
        assert kinds(job).count("start") == 1
    requeued = [job for job in jobs if any(e["outcome"] == "requeued" for e in job.history)]
    assert {job.pk for job in requeued} == set(lost[0])
    assert "reply of the claim that took it was lost" in caplog.text
