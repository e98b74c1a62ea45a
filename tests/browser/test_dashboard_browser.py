"""The dashboard and a job's "why is it not running?" and attempts in headless Chromium.

``DBWORKER_SCREENSHOTS=1`` writes admin-dashboard.png and admin-explain.png into
docs/img/ (docs/admin.md shows them).
"""

import re
from datetime import UTC, timedelta

import pytest
from django.utils import timezone

from django_dbworker.models import JobStats, Pause, WorkerProcess
from tests.factories import JobFactory

from .test_admin_browser import screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HANDLER = "tests.testapp.handlers.BehaviorHandler"
SCRIPT = "<script>alert(1)</script>"


def log_in(page, live_server, django_user_model, next_url):
    django_user_model.objects.create_superuser("operator", "op@example.com", "a-long-password")
    page.goto(f"{live_server.url}/admin/login/?next={next_url}")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "a-long-password")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(next_url) + "$"))


def fill_statistics(now):
    """An hour of per-minute statistics and a day of hourly ones, from two workers."""
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    rows = []
    for worker in ("build-1:4121:9f3a2c", "build-2:518:77be01"):
        for m in range(24 * 60):
            histogram = [0] * 19
            histogram[7], histogram[9] = 40 + m % 13, 3 + m % 4
            rows.append(
                JobStats(
                    minute=minute - timedelta(minutes=m),
                    handler=HANDLER,
                    model="testapp.QueueJob",
                    worker=worker,
                    completed=40 + (m * 7) % 25,
                    errored=(m % 9 == 0) * 3,
                    failed=(m % 17 == 0) * 2,
                    duration_sum=10.0,
                    durations=histogram,
                )
            )
    JobStats.objects.bulk_create(rows)


def register(worker_id, jobs, alive=True):
    beat = timezone.now() - timedelta(seconds=0 if alive else 3600)
    WorkerProcess.objects.create(
        worker_id=worker_id,
        hostname=worker_id.split(":")[0],
        pid=int(worker_id.split(":")[1]),
        handlers=[HANDLER],
        num_handlers=4,
        jobs=jobs,
        num_jobs=len(jobs),
        started_at=beat - timedelta(hours=2),
        last_heartbeat_at=beat,
        # Alive for five intervals: the browser may take more than the 10 s of the
        # default's on a loaded host (seen in CI on MariaDB: "0 +2 silent").
        heartbeat_interval=60.0,
    )


def test_dashboard(page, live_server, django_user_model, settings):
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [HANDLER]}
    now = timezone.now()
    for _ in range(12):
        JobFactory()
    for _ in range(3):
        JobFactory(process_after=now + timedelta(hours=2))
    JobFactory(state="errored", num_failures=1, process_after=now + timedelta(minutes=3))
    running = [
        JobFactory(state="processing", started_at=now, last_heartbeat_at=now) for _ in range(2)
    ]
    register("build-1:4121:9f3a2c", [f"testapp.QueueJob:{j.pk}" for j in running])
    register("build-2:518:77be01", [])
    fill_statistics(now)

    log_in(page, live_server, django_user_model, "/admin/testapp/queuejob/")
    page.click("a.dbworker-dashboard-link")
    page.wait_for_url(re.compile(r"/admin/testapp/queuejob/dashboard/$"))
    assert page.locator('meta[http-equiv="refresh"]').count() == 1
    page.click("a.dbworker-refresh-off")
    page.wait_for_url(re.compile(r"refresh=0$"))
    assert page.locator('meta[http-equiv="refresh"]').count() == 0

    row = page.locator("tr.dbworker-handler-row")
    assert row.count() == 1
    figure = {
        name: row.locator(f"td[data-figure={name}]").inner_text()
        for name in ("queued", "scheduled", "processing", "errored", "live_workers", "busy")
    }
    assert figure == {
        "queued": "12",
        "scheduled": "3",
        "processing": "2",
        "errored": "1",
        "live_workers": "2",
        "busy": "2 / 8",
    }
    charts = page.locator("svg.dbworker-chart")
    assert charts.count() == 2
    assert charts.nth(0).locator("g.dbworker-bar").count() == 60
    assert charts.nth(1).locator("g.dbworker-bar").count() == 24
    box = charts.nth(0).bounding_box()
    assert box is not None
    assert box["width"] > 300
    assert box["height"] > 50
    screenshot(page, "admin-dashboard.png")


def test_job_page_says_why_it_is_not_running(page, live_server, django_user_model, settings):
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [HANDLER]}
    now = timezone.now()
    Pause.objects.create(name=HANDLER, paused_by="alice", reason=f"deploy {SCRIPT}")
    register("build-1:4121:9f3a2c", [], alive=False)
    history = [
        {
            "worker": worker,
            "started_at": (now - timedelta(minutes=minutes)).isoformat(),
            "ended_at": (now - timedelta(minutes=minutes, seconds=-secs)).isoformat(),
            "outcome": outcome,
            "message": message,
            "logs": [{"key": "clone", "exit_code": 0}, {"key": "test", "exit_code": code}],
        }
        for worker, minutes, secs, outcome, message, code in (
            ("build-1:4121:9f3a2c", 20, 41, "errored", "AssertionError: 3 tests failed", 1),
            ("build-2:518:77be01", 12, 30, "reset", "its worker stopped heartbeating", None),
            ("build-1:4121:9f3a2c", 6, 2, "errored", f"TimeoutError: {SCRIPT}", 124),
        )
    ]
    job = JobFactory(
        state="errored",
        num_failures=2,
        num_resets=1,
        process_after=now + timedelta(minutes=4),
        failure_message="TimeoutError: the test suite took longer than 60 s",
        worker_hostname="build-1:4121:9f3a2c",
        history=history,
    )
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    url = f"/admin/testapp/queuejob/{job.pk}/change/"
    log_in(page, live_server, django_user_model, url)

    reasons = page.locator("li.dbworker-reason")
    found = [reasons.nth(i).get_attribute("data-reason") for i in range(reasons.count())]
    assert found == ["retry_wait", "no_live_worker", "paused"]
    assert "silent worker" in page.locator("li[data-reason=no_live_worker]").inner_text()
    assert SCRIPT in page.locator("li[data-reason=paused]").inner_text()  # shown as text
    attempts = page.locator("tr.dbworker-attempt")
    assert attempts.count() == 3
    assert "reset" in attempts.nth(1).inner_text()
    assert "124" in attempts.nth(2).inner_text()
    assert dialogs == []  # nothing from the job ran as script
    page.locator("fieldset:has(.dbworker-reasons)").scroll_into_view_if_needed()
    screenshot(page, "admin-explain.png")
