"""The dashboard, "why is this job not running?", the attempt history, and the cost of
the admin's pages at size (estimated counts, no scan of the job table: EXPLAIN)."""

import io
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.db.models import Q
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dbworker import figures
from django_dbworker.admin.explain import explain
from django_dbworker.admin.serving import serving
from django_dbworker.control.limits import Limits
from django_dbworker.control.models import RateBucket
from django_dbworker.models import JobStats, Pause, WorkerProcess
from tests.factories import JobFactory
from tests.testapp.handlers import BehaviorHandler
from tests.testapp.models import QueueJob, ReportJob

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert(1)</script>"
HANDLER = "tests.test_admin_dashboard.DashboardHandler"
CAPPED = "tests.test_admin_dashboard.CappedHandler"
DASHBOARD = "admin:testapp_queuejob_dashboard"


class DashboardHandler(BehaviorHandler):
    max_num_retries = 2
    max_num_resets = 1


class CappedHandler(BehaviorHandler):
    max_concurrency = 1


class OtherHandler(BehaviorHandler):
    """A second handler that takes every QueueJob."""


class PickyHandler(BehaviorHandler):
    dequeue_filter = Q(behavior="picky")


class PerKeyHandler(BehaviorHandler):
    concurrency_key = "behavior"
    max_concurrency_per_key = 1


class RatedHandler(BehaviorHandler):
    rate_limit = "1/h"


class KeyRatedHandler(BehaviorHandler):
    concurrency_key = "size"
    rate_limit_per_key = "1/h"


OTHER = "tests.test_admin_dashboard.OtherHandler"
PICKY = "tests.test_admin_dashboard.PickyHandler"
PER_KEY = "tests.test_admin_dashboard.PerKeyHandler"
RATED = "tests.test_admin_dashboard.RatedHandler"
KEY_RATED = "tests.test_admin_dashboard.KeyRatedHandler"


def change(job):
    return reverse("admin:testapp_queuejob_change", args=[job.pk])


def register(name=HANDLER, alive=True, jobs=(), worker_id="w-1:10:abc"):
    beat = timezone.now() - timedelta(seconds=0 if alive else 3600)
    return WorkerProcess.objects.create(
        worker_id=worker_id,
        hostname="w-1",
        pid=10,
        handlers=[name],
        num_handlers=4,
        jobs=list(jobs),
        num_jobs=len(jobs),
        started_at=beat,
        last_heartbeat_at=beat,
    )


def codes(job):
    job.refresh_from_db()
    return [r.code for r in explain(job, serving(QueueJob))]


# -- the dashboard ---------------------------------------------------------------------


@override_settings(DBWORKER={"HANDLERS": [HANDLER]})
def test_dashboard_shows_figures_per_handler_and_charts(admin_client):
    now = timezone.now()
    JobFactory.create_batch(3)
    JobFactory(process_after=now + timedelta(hours=1))
    JobFactory(state="errored", process_after=now + timedelta(minutes=5))
    running = JobFactory(state="processing", started_at=now, last_heartbeat_at=now)
    JobFactory.create_batch(2, state="completed")
    register(jobs=[f"testapp.QueueJob:{running.pk}"])
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    histogram = [0] * 19
    histogram[6] = 10  # 50-100 ms
    JobStats.objects.create(
        minute=minute - timedelta(minutes=2),
        handler=HANDLER,
        model="testapp.QueueJob",
        worker="w-1:10:abc",
        completed=9,
        errored=1,
        duration_sum=0.8,
        durations=histogram,
    )
    response = admin_client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    board = response.context["board"]
    [row] = board.rows
    assert row.name == HANDLER
    assert (row.queued, row.scheduled, row.processing, row.errored) == (3, 1, 1, 1)
    assert row.oldest_age is not None
    assert row.oldest_age >= 0
    assert (row.live_workers, row.busy, row.threads) == (1, 1, 4)
    assert 0.05 <= row.p50 <= row.p95 <= 0.1
    assert len(board.minutes) == 60
    assert len(board.hours) == 24
    assert board.minutes_total.completed == 9
    assert board.minutes_total.failures == 1
    assert board.hours_total.completed == 9
    html = response.content.decode()
    assert html.count('<svg class="dbworker-chart"') == 2
    assert '<meta http-equiv="refresh" content="15">' in html
    assert "stop refreshing" in html
    off = admin_client.get(reverse(DASHBOARD), {"refresh": "0"}).content.decode()
    assert 'http-equiv="refresh"' not in off
    # The list links to it.
    listing = admin_client.get(reverse("admin:testapp_queuejob_changelist")).content.decode()
    assert reverse(DASHBOARD) in listing


def test_dashboard_without_a_known_handler_counts_the_whole_table(admin_client):
    JobFactory.create_batch(2)
    board = admin_client.get(reverse(DASHBOARD)).context["board"]
    [row] = board.rows
    assert row.queued == 2
    assert row.live_workers == 0


def test_dashboard_needs_view_permission(client, django_user_model):
    user = django_user_model.objects.create_user("someone", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(reverse(DASHBOARD)).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_queuejob"))
    assert client.get(reverse(DASHBOARD)).status_code == 200


@override_settings(DBWORKER={"HANDLERS": [HANDLER]})
def test_dashboard_escapes_what_it_shows(admin_client):
    Pause.objects.create(name=HANDLER, reason=SCRIPT)
    register(name=HANDLER, worker_id=SCRIPT)
    html = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert SCRIPT not in html
    assert f"paused: {HANDLER}" in html


# -- why is this job not running? ------------------------------------------------------


@override_settings(DBWORKER={"HANDLERS": [HANDLER]})
def test_explanation_reasons():
    now = timezone.now()
    scheduled = JobFactory(process_after=now + timedelta(hours=1))
    waiting = JobFactory(state="errored", num_failures=1, process_after=now + timedelta(minutes=1))
    retries = JobFactory(state="failed", num_failures=3, failure_message="ValueError: x")
    resets = JobFactory(state="failed", num_resets=2)
    canceled = JobFactory(state="canceled", failure_message="canceled before it ran")
    ready = JobFactory()
    assert codes(scheduled) == ["scheduled", "no_live_worker"]
    assert codes(waiting) == ["retry_wait", "no_live_worker"]
    assert codes(retries) == ["retries_spent"]
    assert codes(resets) == ["resets_spent"]
    assert codes(canceled) == ["canceled"]
    assert codes(ready) == ["no_live_worker"]
    register(alive=False)
    assert "silent worker" in explain(ready, serving(QueueJob))[0].text
    WorkerProcess.objects.all().delete()
    register()
    assert codes(ready) == ["claimable"]
    Pause.objects.create(name=HANDLER, paused_by="ops", reason="deploy")
    assert codes(ready) == ["paused"]


def test_explanation_without_a_handler():
    assert codes(JobFactory()) == ["no_handler"]


@override_settings(DBWORKER={"HANDLERS": [CAPPED]})
def test_explanation_concurrency_limit_held():
    register(name=CAPPED)
    ready = JobFactory()
    assert codes(ready) == ["claimable"]
    JobFactory(state="processing", started_at=timezone.now(), last_heartbeat_at=timezone.now())
    assert codes(ready) == ["concurrency_limit"]


@pytest.mark.django_db(transaction=True)  # the resetter writes on its own connection
@override_settings(DBWORKER={"HANDLERS": [HANDLER], "RESET_INTERVAL": 0.5})
def test_a_job_the_resetter_failed_is_explained_as_resets_spent():
    """Issue 29, finding 10: the resetter fails a stalled job at num_resets ==
    max_num_resets (1 here); it was explained as a non-retryable error."""
    old = timezone.now() - timedelta(hours=1)
    stalled = JobFactory(
        state="processing", num_resets=1, started_at=old, last_heartbeat_at=old,
        worker_hostname="gone:1:abc",
    )  # fmt: skip
    call_command("runresetter", HANDLER, "--once", stdout=io.StringIO())
    stalled.refresh_from_db()
    assert (stalled.state, stalled.num_resets) == ("failed", 1)
    assert codes(stalled) == ["resets_spent"]
    # A non-retryable failure of a job that was reset as often before is not that.
    raised = JobFactory(
        state="failed", num_resets=1, num_failures=1, failure_message="NonRetryableError: bad"
    )
    assert codes(raised) == ["failed"]


@override_settings(DBWORKER={"HANDLERS": [HANDLER, OTHER]})
def test_a_job_two_handlers_take_waits_only_while_both_are_held():
    """Issue 29, finding 10: a handler without a live worker does not hold a job another
    live handler takes."""
    ready = JobFactory()
    register(name=OTHER)
    reasons = explain(ready, serving(QueueJob))
    assert [(r.code, r.blocking) for r in reasons] == [
        ("no_live_worker", False),
        ("claimable", False),
    ]
    assert "Another handler that takes it is free." in reasons[0].text
    Pause.objects.create(name=OTHER)
    reasons = explain(ready, serving(QueueJob))
    assert [(r.code, r.blocking) for r in reasons] == [
        ("no_live_worker", True),
        ("paused", True),
    ]


@override_settings(DBWORKER={"HANDLERS": [PICKY]})
def test_explanation_no_matching_handler():
    register(name=PICKY)
    assert codes(JobFactory(behavior="ok")) == ["no_matching_handler"]
    assert codes(JobFactory(behavior="picky")) == ["claimable"]


@override_settings(DBWORKER={"HANDLERS": [PER_KEY]})
def test_explanation_key_concurrency_limit_held():
    register(name=PER_KEY)
    now = timezone.now()
    JobFactory(behavior="busy", state="processing", started_at=now, last_heartbeat_at=now)
    assert codes(JobFactory(behavior="busy")) == ["key_concurrency_limit"]
    assert codes(JobFactory(behavior="idle")) == ["claimable"]


@override_settings(DBWORKER={"HANDLERS": [RATED]})
def test_explanation_rate_limit_held():
    register(name=RATED)
    ready = JobFactory()
    assert codes(ready) == ["claimable"]
    name = Limits.of(RatedHandler()).bucket_name(False)
    RateBucket.objects.create(name=name, tokens=0.0, at=time.time(), full_at=time.time() + 3600)
    assert codes(ready) == ["rate_limit"]


@override_settings(DBWORKER={"HANDLERS": [KEY_RATED]})
def test_explanation_key_rate_limit_held():
    """Its key's bucket is empty: the per-key rate limit holds it (it was told
    "claimable"), while a job of another key is claimable."""
    register(name=KEY_RATED)
    spent, other = JobFactory(size=7), JobFactory(size=8)
    name = Limits.of(KeyRatedHandler()).bucket_name(True)
    RateBucket.objects.create(
        name=name, key="7", tokens=0.0, at=time.time(), full_at=time.time() + 3600
    )
    assert codes(spent) == ["key_rate_limit"]
    [reason] = explain(spent, serving(QueueJob))
    assert "per size" in reason.text
    assert "for 7" in reason.text
    assert codes(other) == ["claimable"]


@override_settings(DBWORKER={"HANDLERS": [HANDLER]})
def test_explanation_of_a_non_retryable_failure():
    failed = JobFactory(state="failed", num_failures=1, failure_message="NonRetryableError: x")
    [reason] = explain(failed, serving(QueueJob))
    assert reason.code == "failed"
    assert "NonRetryableError: x" in reason.text


@override_settings(DBWORKER={"HANDLERS": [HANDLER]})
def test_explanation_of_running_and_completed_jobs():
    now = timezone.now()
    running = JobFactory(
        state="processing", started_at=now, last_heartbeat_at=now, worker_hostname="w:1:a"
    )
    stalled = JobFactory(
        state="processing", started_at=now, last_heartbeat_at=now - timedelta(hours=1), cancel=True
    )
    done = JobFactory(state="completed", started_at=now, finished_at=now)
    assert codes(running) == ["running"]
    assert codes(stalled) == ["running", "cancel_requested", "stalled"]
    assert codes(done) == ["completed"]


@override_settings(DBWORKER={"HANDLERS": [HANDLER]})
def test_job_page_shows_the_explanation_escaped(admin_client):
    Pause.objects.create(name=HANDLER, paused_by="ops", reason=SCRIPT)
    job = JobFactory()
    html = admin_client.get(change(job)).content.decode()
    assert "Why is this job not running?" in html
    assert 'data-reason="paused"' in html
    assert 'data-reason="no_live_worker"' in html
    assert SCRIPT not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# -- attempt history -------------------------------------------------------------------


def test_job_page_lists_every_attempt(admin_client):
    now = timezone.now()
    history = [
        {
            "worker": f"w-{n}:1:abc",
            "started_at": (now - timedelta(minutes=10 - n)).isoformat(),
            "ended_at": (now - timedelta(minutes=10 - n, seconds=-3)).isoformat(),
            "outcome": outcome,
            "message": f"{outcome} number {n} {SCRIPT}",
            "logs": [{"key": "build", "exit_code": n}],
        }
        for n, outcome in enumerate(["errored", "reset", "errored"], start=1)
    ]
    job = JobFactory(
        state="completed",
        started_at=now - timedelta(seconds=5),
        finished_at=now,
        worker_hostname="w-4:1:abc",
        history=history,
        execution_logs=[{"key": "deploy", "exit_code": 0}],
    )
    html = admin_client.get(change(job)).content.decode()
    assert len(re.findall(r"<tr class=\"dbworker-attempt[ \"]", html)) == 4
    for n in (1, 2, 3, 4):
        assert f"w-{n}:1:abc" in html
    assert "errored number 1" in html
    assert "reset number 2" in html
    assert SCRIPT not in html
    assert "(this attempt)" in html
    assert "deploy" in html
    assert "3.0 s" in html  # each attempt's duration


def test_history_of_garbage_json_renders(admin_client):
    job = JobFactory(state="failed", history=["not a dict", {"outcome": SCRIPT, "logs": "x"}])
    response = admin_client.get(change(job))
    assert response.status_code == 200
    assert SCRIPT not in response.content.decode()


# -- counts and cost at size -----------------------------------------------------------


def test_small_tables_are_counted_exactly(admin_client):
    JobFactory.create_batch(2, state="completed")
    response = admin_client.get(reverse("admin:testapp_queuejob_changelist"))
    assert response.context["dbworker_total_estimated"] is False
    assert response.context["cl"].paginator.estimated is False
    assert response.context["cl"].result_count == 2


def test_worker_filter_lists_the_registry(admin_client):
    register(worker_id="reg-1:1:aaa")
    JobFactory(state="completed", worker_hostname="old-9:9:zzz")
    html = admin_client.get(reverse("admin:testapp_queuejob_changelist")).content.decode()
    assert "?worker=reg-1%3A1%3Aaaa" in html
    assert "?worker=old-9" not in html


def test_without_the_worker_index_the_worker_filter_shows_running_jobs(admin_client):
    register(worker_id="reg-1:1:aaa")
    running = ReportJob.objects.create(
        tenant="t", state="processing", worker_hostname="reg-1:1:aaa"
    )
    ReportJob.objects.create(
        tenant="t", kind="done", state="completed", worker_hostname="reg-1:1:aaa"
    )
    url = reverse("admin:testapp_reportjob_changelist") + "?worker=reg-1%3A1%3Aaaa"
    response = admin_client.get(url)
    assert [job.pk for job in response.context["cl"].result_list] == [running.pk]
    assert "worker (running jobs)" in response.content.decode()


needs_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="estimates and plans are PostgreSQL's"
)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's counts are exact")
@pytest.mark.django_db(transaction=True)  # MariaDB's ANALYZE TABLE commits
def test_large_tables_get_estimates_labelled(admin_client, monkeypatch):
    # Past EXACT_BELOW rows: estimates for the final states, and for the others that
    # hold that many (jobs for later); fewer are counted exactly.
    # (MariaDB's estimates of a few rows are rough: a margin of tens of rows.)
    monkeypatch.setattr(figures, "EXACT_BELOW", 40)
    JobFactory.create_batch(80, state="completed")
    JobFactory.create_batch(2)
    with connection.cursor() as cursor:
        table = QueueJob._meta.db_table
        cursor.execute(f"ANALYZE {'TABLE ' if connection.vendor == 'mysql' else ''}{table}")
    response = admin_client.get(reverse("admin:testapp_queuejob_changelist"))
    found = {c["state"]: (c["count"], c["estimated"]) for c in response.context["dbworker_counts"]}
    assert found["queued"] == (2, False)  # exact: an active state with fewer rows
    assert found["completed"][1] is True
    assert response.context["cl"].paginator.estimated is True
    html = response.content.decode()
    assert "an estimate from the database's statistics" in html


@needs_postgresql
@pytest.mark.django_db(transaction=True)
@override_settings(DBWORKER={"HANDLERS": [HANDLER]})
def test_jobs_for_later_make_queued_and_errored_estimates_not_a_count_of_them_all(
    admin_client, monkeypatch
):
    """A million jobs for later (queued for tomorrow, retries waiting) made the list and
    the dashboard count them all at each request (1 s and more): past EXACT_BELOW rows a
    state a job passes through is an estimate too, labelled; the others stay exact."""
    monkeypatch.setattr(figures, "EXACT_BELOW", 3)
    later = timezone.now() + timedelta(days=1)
    JobFactory.create_batch(4, process_after=later)
    JobFactory.create_batch(4, state="errored", num_failures=1, process_after=later)
    JobFactory(state="processing", started_at=timezone.now(), last_heartbeat_at=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {QueueJob._meta.db_table}")
    listing = admin_client.get(reverse("admin:testapp_queuejob_changelist"))
    found = {c["state"]: (c["count"], c["estimated"]) for c in listing.context["dbworker_counts"]}
    assert found["queued"][1] is True
    assert found["errored"][1] is True
    assert found["processing"] == (1, False)
    board = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert re.search(r'data-figure="scheduled">≈ \d', board), board
    assert 'data-figure="processing">1<' in board


def job_table_plans(queries):
    """EXPLAIN each captured statement that reads the job table, with sequential scans
    made as costly as PostgreSQL allows (so it picks an index wherever one applies)."""
    table = QueueJob._meta.db_table
    plans = []
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in queries:
            sql = query["sql"]
            if f'"{table}"' not in sql or not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute(f"EXPLAIN {sql}")
            plans.append((sql, "\n".join(row[0] for row in cursor.fetchall())))
    return plans


@needs_postgresql
@override_settings(DBWORKER={"HANDLERS": [HANDLER]})
def test_no_page_scans_the_job_table(admin_client, monkeypatch):
    from django_dbworker import figures

    # The counts of a large table (estimates for finished rows): below EXACT_BELOW
    # rows every state is counted exactly, and reading a small table is the right plan.
    monkeypatch.setattr(figures, "EXACT_BELOW", 1000)
    now = timezone.now()
    register(jobs=[])
    QueueJob.objects.bulk_create(
        [QueueJob(state="completed", worker_hostname=f"w-{i % 5}:1:a") for i in range(3000)]
        + [QueueJob(state="failed", failure_message="boom") for _ in range(100)]
        + [QueueJob() for _ in range(300)]
        + [QueueJob(state="errored", process_after=now + timedelta(minutes=5)) for _ in range(30)]
        + [QueueJob(state="processing", started_at=now, last_heartbeat_at=now) for _ in range(5)]
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {QueueJob._meta.db_table}")
    listing = reverse("admin:testapp_queuejob_changelist")
    failed = QueueJob.objects.filter(state="failed").first()
    queued = QueueJob.objects.filter(state="queued").last()
    pages = {
        "list": listing,
        "state": f"{listing}?state__exact=queued",
        "stalled": f"{listing}?heartbeat=stalled",
        "cancel": f"{listing}?cancel_requested=yes",
        "worker": f"{listing}?worker=w-1%3A1%3Aa",
        "id": f"{listing}?q={queued.pk}",
        "dashboard": reverse(DASHBOARD),
        "failed job": change(failed),
        "queued job": change(queued),
    }
    for name, url in pages.items():
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200, name
        assert len(captured.captured_queries) <= 16, (name, len(captured.captured_queries))
        plans = job_table_plans(captured.captured_queries)
        assert plans, name
        for sql, plan in plans:
            assert "Seq Scan" not in plan, f"{name}: {sql}\n{plan}"


def test_explain_of_a_job_counts_at_most_the_limit(monkeypatch):
    from django_dbworker.admin import explain as module

    monkeypatch.setattr(module, "AHEAD_LIMIT", 2)
    jobs = JobFactory.create_batch(5)
    with override_settings(DBWORKER={"HANDLERS": [HANDLER]}):
        register()
        [reason] = explain(jobs[-1], serving(QueueJob))
    assert "more than 2 claimable" in reason.text


def test_chart_of_no_statistics_is_empty_not_broken():
    from django_dbworker.admin.charts import bar_chart
    from django_dbworker.admin.dashboard import Bucket

    svg = str(bar_chart([Bucket(datetime(2026, 1, 1, tzinfo=UTC))], SCRIPT, "%H:%M", 1))
    assert svg.startswith("<svg")
    assert SCRIPT not in svg


def test_the_list_filters_jobs_by_what_they_wait_for(admin_client):
    """'waiting for': nothing (claimable now) or a time (scheduled, a retry's delay)."""
    later = timezone.now() + timedelta(hours=1)
    now = JobFactory()
    scheduled = JobFactory(process_after=later)
    retry = JobFactory(state="errored", num_failures=1, process_after=later)
    JobFactory(state="completed")
    listing = reverse("admin:testapp_queuejob_changelist")

    def listed(query):
        return sorted(j.pk for j in admin_client.get(listing + query).context["cl"].result_list)

    assert listed("?due=now") == [now.pk]
    assert listed("?due=later") == sorted([scheduled.pk, retry.pk])
