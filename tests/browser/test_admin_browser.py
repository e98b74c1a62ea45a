"""The admin end to end in headless Chromium: log in, act on jobs, read a job's log.

``DBWORKER_SCREENSHOTS=1`` writes the screenshots of docs/admin.md into docs/img/.
"""

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.factories import JobFactory
from tests.testapp.models import QueueJob

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def screenshot(page, name):
    if os.environ.get("DBWORKER_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / name), full_page=True)


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
            failure_message="RuntimeError: repository not found\n\nTraceback (most recent "
            "call last):\n  ...",
        )
        for _ in range(2)
    ]
    JobFactory(
        state="processing",
        started_at=now - timedelta(seconds=40),
        last_heartbeat_at=now - timedelta(seconds=1),
        worker_hostname="build-2:518:77be01",
    )
    done = JobFactory(
        state="completed",
        started_at=now - timedelta(minutes=2),
        finished_at=now - timedelta(minutes=1),
        worker_hostname="build-1:4121:9f3a2c",
        execution_logs=[
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
        ],
    )
    return failed, done


def run_action(page, label, pks):
    for pk in pks:
        page.check(f"input[name=_selected_action][value='{pk}']")
    page.select_option("select[name=action]", label=label)
    page.click("button[name=index]")


def test_operator_logs_in_acts_on_jobs_and_reads_the_log(page, live_server, django_user_model):
    django_user_model.objects.create_superuser("operator", "op@example.com", "a-long-password")
    failed, done = make_jobs()
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

    page.click(f"a[href$='/admin/testapp/queuejob/{done.pk}/change/']")
    page.wait_for_url(re.compile(rf"/admin/testapp/queuejob/{done.pk}/change/$"))
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
    screenshot(page, "admin-job.png")
