"""The controls in the admin, in headless Chromium: pause a handler (the form suggests
what live workers run), resume it, switch a schedule off, read the audit trail
(issue 12). ``DBWORKER_SCREENSHOTS=1`` writes docs/img/admin-pauses.png and
admin-schedules.png for docs/scheduling.md."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbworker.control.models import Pause, Schedule
from django_dbworker.maintenance.scheduler import Scheduler
from django_dbworker.models import WorkerProcess
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

from .test_admin_browser import run_action, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REPORTS = "tests.testapp.handlers.ReportHandler"


def log_in(page, live_server, django_user_model, path):
    django_user_model.objects.create_superuser("operator", "op@example.com", "a-long-password")
    page.goto(f"{live_server.url}/admin/login/?next={path}")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "a-long-password")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(path) + "$"))


def test_operator_pauses_resumes_and_switches_a_schedule_off(page, live_server, django_user_model):
    now = timezone.now()
    WorkerProcess.objects.create(
        worker_id="build-1:4121:9f3a2c",
        hostname="build-1",
        pid=4121,
        handlers=[REPORTS, "tests.testapp.handlers.ScheduledHandler"],
        num_handlers=4,
        started_at=now,
        last_heartbeat_at=now,
    )
    scheduler = Scheduler([h.ScheduledHandler()])
    scheduler._pass(now - timedelta(seconds=3))
    scheduler._pass(timezone.now())
    last_job = QueueJob.objects.order_by("-pk").first()

    log_in(page, live_server, django_user_model, "/admin/django_dbworker/pause/")
    page.click("ul.object-tools a.addlink")
    page.wait_for_url(re.compile(r"/admin/django_dbworker/pause/add/$"))
    options = page.locator("datalist#dbworker-suggestions option")
    assert REPORTS in [options.nth(i).get_attribute("value") for i in range(options.count())]
    page.fill("#id_name", REPORTS)
    page.fill("#id_reason", "<b>deploy</b> of 2.4")
    page.click("input[name=_save]")
    page.wait_for_url(re.compile(r"/admin/django_dbworker/pause/$"))
    row = page.locator("#result_list tbody tr").first
    assert REPORTS in row.inner_text()
    assert "<b>deploy</b> of 2.4" in row.locator("td.field-reason").inner_text()  # as text
    assert row.locator("td.field-reason b").count() == 0
    assert "operator" in row.locator("td.field-paused_by").inner_text()
    screenshot(page, "admin-pauses.png")

    run_action(page, "Resume selected (claim their jobs again)", [Pause.objects.get().pk])
    assert "Resumed 1" in page.locator("ul.messagelist li").first.inner_text()
    assert not Pause.objects.exists()

    page.goto(f"{live_server.url}/admin/django_dbworker/schedule/")
    row = page.locator("#result_list tbody tr").first
    assert "every-second" in row.inner_text()
    assert row.locator("td.field-expression").inner_text() == "* * * * * *"
    assert row.locator("td.field-switch").inner_text() == "on"
    assert row.locator("td.field-last_outcome").inner_text() in ("queued", "completed")
    screenshot(page, "admin-schedules.png")
    run_action(page, "Switch selected schedules off", [Schedule.objects.get().pk])
    assert page.locator("#result_list td.field-switch").first.inner_text() == "off"
    assert not Schedule.objects.get().enabled
    page.click(f"#result_list a:has-text('testapp.QueueJob:{last_job.pk}')")
    page.wait_for_url(re.compile(rf"/admin/testapp/queuejob/{last_job.pk}/change/$"))

    page.goto(f"{live_server.url}/admin/django_dbworker/auditentry/")
    trail = page.locator("#result_list tbody").inner_text()
    for action in ("pause", "resume", "disable schedule"):
        assert action in trail
    assert trail.count("operator") == 3


def test_running_jobs_show_their_last_check_in(page, live_server, django_user_model):
    from tests.factories import JobFactory

    now = timezone.now()
    job = JobFactory(
        state="processing",
        started_at=now - timedelta(minutes=3),
        last_heartbeat_at=now,
        worker_hostname="build-1:4121:9f3a2c",
        progress={"text": "rows=335000", "done": 335000, "total": 1000000, "at": now.isoformat()},
    )
    JobFactory.create_batch(2)
    log_in(page, live_server, django_user_model, "/admin/testapp/queuejob/")
    row = page.locator(f"#result_list tr:has(input[value='{job.pk}'])")
    bar = row.locator("progress")
    assert bar.get_attribute("title") == "335000 of 1000000"
    assert "34%" in row.inner_text()
    assert "rows=335000" in row.inner_text()
    screenshot(page, "admin-progress.png")
    page.goto(f"{live_server.url}/admin/testapp/queuejob/{job.pk}/change/")
    assert "rows=335000" in page.locator("#dbworker-live").inner_text()
