"""The admin end to end in headless Chromium: log in, act on jobs, confirm an operation
on a job's page, read a job's log; the job list fits a 1440 px wide window.

``DBWORKER_SCREENSHOTS=1`` writes the screenshots of docs/admin.md into docs/img/.
"""

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone

from tests.factories import JobFactory
from tests.testapp.models import QueueJob

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")


def screenshot(page, name):
    if os.environ.get("DBWORKER_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / name), full_page=True)


def execution_logs(now):
    return [
        {
            "key": "clone",
            "command": ["git", "clone", "--depth=1", "https://git.example.com/app.git"],
            "start_time": (now - timedelta(minutes=2)).isoformat(),
            "duration_ms": 2140,
            "exit_code": 0,
            "out": "Cloning into 'app'...\n",
        },
        {
            "key": "test",
            "command": ["make", "test"],
            "start_time": (now - timedelta(seconds=100)).isoformat(),
            "duration_ms": 38500,
            "exit_code": 0,
            "out": "".join(f"tests/test_{i:03}.py ....... [{i}%]\n" for i in range(100)),
        },
        {
            "key": "report",
            "command": ["echo", "<script>alert(1)</script>"],
            "start_time": (now - timedelta(seconds=61)).isoformat(),
            "duration_ms": 12,
            "exit_code": 0,
            "out": "<script>alert(1)</script>\n",
        },
    ]


def make_jobs():
    now = timezone.now()
    for _ in range(3):
        JobFactory(behavior="ok")
    JobFactory(process_after=now + timedelta(hours=3))
    failed = [
        JobFactory(
            state="failed",
            num_failures=3,
            started_at=now - timedelta(minutes=5),
            finished_at=now - timedelta(minutes=5) + timedelta(seconds=2),
            worker_hostname="build-1:4121:9f3a2c",
            failure_message="RuntimeError: repository not found: https://git.example.com/"
            "platform/payments-service-with-a-long-name.git (exit code 128)\n\nTraceback "
            "(most recent call last):\n  ...",
        )
        for _ in range(2)
    ]
    JobFactory(
        state="processing",
        started_at=now - timedelta(seconds=40),
        last_heartbeat_at=now - timedelta(seconds=1),
        worker_hostname="build-2:518:77be01",
    )
    errored = JobFactory(
        state="errored",
        num_failures=1,
        started_at=now - timedelta(minutes=2),
        finished_at=now - timedelta(seconds=60),
        process_after=now + timedelta(minutes=5),
        worker_hostname="build-1:4121:9f3a2c",
        failure_message="subprocess.CalledProcessError: Command '['make', 'deploy']' "
        "returned non-zero exit status 2.",
        execution_logs=execution_logs(now)[:2],
    )
    done = JobFactory(
        state="completed",
        started_at=now - timedelta(minutes=2),
        finished_at=now - timedelta(minutes=1),
        worker_hostname="build-1:4121:9f3a2c",
        execution_logs=execution_logs(now),
    )
    return failed, errored, done


def run_action(page, label, pks):
    for pk in pks:
        page.check(f"input[name=_selected_action][value='{pk}']")
    page.select_option("select[name=action]", label=label)
    page.click("button[name=index]")


def assert_the_list_fits(page):
    layout = page.evaluate(
        """() => ({
            page: document.scrollingElement.scrollWidth,
            window: window.innerWidth,
            table: document.querySelector("#result_list").scrollWidth,
            results: document.querySelector("#changelist-form .results").clientWidth,
        })"""
    )
    assert layout["window"] == 1440
    assert layout["page"] <= layout["window"], layout
    assert layout["table"] <= layout["results"], layout  # no sideways scrolling in the list


def test_operator_logs_in_acts_on_jobs_and_reads_the_log(page, live_server, django_user_model):
    django_user_model.objects.create_superuser("operator", "op@example.com", "a-long-password")
    failed, errored, done = make_jobs()
    queued = list(QueueJob.objects.filter(state="queued").order_by("id")[:2])
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

    page.goto(f"{live_server.url}/admin/login/?next=/admin/testapp/queuejob/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "a-long-password")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/testapp/queuejob/$"))

    counts = page.locator("ul.dbworker-counts")
    assert counts.locator("a[data-state=queued] .dbworker-count").inner_text() == "4"
    assert counts.locator("a[data-state=failed] .dbworker-count").inner_text() == "2"
    assert counts.locator("a[data-state=processing] .dbworker-count").inner_text() == "1"
    row = page.locator(f"#result_list tr:has(input[value='{done.pk}'])")
    for column in ("queued", "started", "finished"):
        assert TIME.match(row.locator(f"td.field-{column}").inner_text().replace("\n", " "))
    assert_the_list_fits(page)
    screenshot(page, "admin-changelist.png")

    run_action(page, "Cancel selected jobs", [j.pk for j in queued])
    message = page.locator("ul.messagelist li").first.inner_text()
    assert message.startswith("Canceled 2 job(s)")
    assert counts.locator("a[data-state=canceled] .dbworker-count").inner_text() == "2"

    run_action(page, "Retry selected jobs (keep counters)", [j.pk for j in failed])
    assert page.locator("ul.messagelist li").first.inner_text().startswith("Queued 2 job(s)")
    assert counts.locator("a[data-state=failed] .dbworker-count").inner_text() == "0"
    retried = QueueJob.objects.filter(pk__in=[j.pk for j in failed])
    assert set(retried.values_list("state", flat=True)) == {"queued"}
    # The retried jobs' failure is the previous attempt's, and says so.
    failure = page.locator(f"#result_list tr:has(input[value='{failed[0].pk}']) td.field-failure")
    assert failure.inner_text().startswith("previous attempt: RuntimeError")
    assert_the_list_fits(page)

    # A job's operations: styled buttons of their own, each confirmed on a page.
    page.click(f"a[href$='/admin/testapp/queuejob/{errored.pk}/change/']")
    page.wait_for_url(re.compile(rf"/admin/testapp/queuejob/{errored.pk}/change/$"))
    buttons = page.locator("section.dbworker-operations a.dbworker-op")
    assert buttons.all_inner_texts() == [
        "Cancel job…",
        "Retry…",
        "Retry with fresh counters…",
        "Run now…",
    ]
    assert page.locator(".object-tools .dbworker-op").count() == 0
    cancel = page.locator("a.dbworker-op-cancel")
    colour = cancel.evaluate("a => getComputedStyle(a).backgroundColor")
    assert colour == "rgb(186, 33, 33)"  # the admin's delete-button red
    page.locator("ol.dbworker-timeline > li").first.wait_for()
    screenshot(page, "admin-job.png")

    cancel.click()
    page.wait_for_url(re.compile(rf"/{errored.pk}/dbworker/cancel/$"))
    assert page.locator("h1").inner_text() == f"Cancel job {errored.pk}?"
    assert "it becomes canceled now" in page.locator(".dbworker-effect").inner_text()
    assert QueueJob.objects.get(pk=errored.pk).state == "errored"  # showing it changed nothing
    screenshot(page, "admin-confirm.png")
    page.click("text=No, take me back")
    page.wait_for_url(re.compile(rf"/{errored.pk}/change/$"))
    assert QueueJob.objects.get(pk=errored.pk).state == "errored"

    page.click("a.dbworker-op-cancel")
    page.click("input[type=submit][value='Yes, cancel it']")
    page.wait_for_url(re.compile(rf"/{errored.pk}/change/$"))
    assert page.locator("ul.messagelist li").first.inner_text().startswith("Canceled 1 job(s)")
    assert QueueJob.objects.get(pk=errored.pk).state == "canceled"
    assert page.locator("section.dbworker-operations a.dbworker-op").all_inner_texts() == [
        "Retry…",
        "Retry with fresh counters…",
    ]
    entry = LogEntry.objects.get(object_id=str(errored.pk))
    assert (entry.user.username, entry.change_message) == (
        "operator",
        "Canceled (dbworker job page)",
    )

    page.goto(f"{live_server.url}/admin/testapp/queuejob/{done.pk}/change/")
    timeline = page.locator("ol.dbworker-timeline > li")
    timeline.first.wait_for()
    assert timeline.count() == 3
    assert "git clone --depth=1 https://git.example.com/app.git" in timeline.nth(0).inner_text()
    assert "took 38.5 s" in timeline.nth(1).inner_text()
    # The long output starts collapsed and opens on a click.
    long_out = timeline.nth(1).locator("details")
    assert long_out.get_attribute("open") is None
    long_out.locator("summary").click()
    assert long_out.get_attribute("open") == ""
    # Log text is shown as text, never run.
    assert "<script>alert(1)</script>" in timeline.nth(2).locator("pre").inner_text()
    assert dialogs == []
