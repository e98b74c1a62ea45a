"""docs/tutorial.md as a newcomer follows it (issue 42, item 24): what it says of the
package's own tables is what migrate makes, and one path goes from the job table to
the admin, a cron schedule, a unique job and a task, each of which works when the
snippets run in order in a fresh project."""

import re

import pytest
from django.apps import apps
from django.db import connection

from tests.conftest import ROOT

TUTORIAL = ROOT / "docs" / "tutorial.md"
NUMBERS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
NUMBERS += ["ten", "eleven", "twelve"]


@pytest.mark.django_db
def test_the_tables_the_tutorial_counts_are_the_ones_migrate_makes():
    """It said "one table of its own" (the registry); migrate makes nine."""
    said = re.search(r"`django_dbworker` has (\w+) tables? of its own", TUTORIAL.read_text())
    assert said, "the tutorial no longer says how many tables django_dbworker has"
    with connection.cursor() as cursor:
        made = [
            name
            for name in connection.introspection.table_names(cursor)
            if name.startswith("django_dbworker_")
        ]
    models = apps.get_app_config("django_dbworker").get_models()
    assert len(made) == len(list(models)), made
    assert said[1] == NUMBERS[len(made)], f"migrate makes {len(made)}: {sorted(made)}"


def test_one_path_from_the_job_table_to_tasks():
    """The tutorial stopped before the admin, cron, unique jobs and tasks."""
    text = TUTORIAL.read_text()
    headings = re.findall(r"(?m)^## \d+\. (.+)$", text)
    wanted = [
        ("A job table", "class ExampleJob(WorkerJob)"),
        ("A handler", "class ExampleHandler(Handler)"),
        ("Enqueue and run", "python manage.py runworker"),
        ("The admin", "class ExampleJobAdmin(WorkerJobAdmin)"),
        ("A cron schedule", "Periodic("),
        ("Unique jobs", "enqueue_unique("),
        ("Tasks with `django.tasks`", "python manage.py runworker --tasks"),
    ]
    assert [h for h in headings if h in dict(wanted)] == [h for h, _ in wanted], headings
    for heading, code in wanted:
        start = text.index(f". {heading}\n")
        section = text[start : text.find("\n## ", start)]
        assert code in section, f"section {heading!r} lacks {code!r}"


@pytest.mark.subprocess
@pytest.mark.timeout(300)
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the fresh project runs on SQLite")
def test_each_step_of_the_path_works_in_a_fresh_project(tmp_path):
    """The snippets, in order (tests/snippets.py, the runner of the docs' snippets):
    the handler's jobs, the schedule's handler's unique jobs and the task are done."""
    snippets = pytest.importorskip("tests.snippets")
    markdown = pytest.importorskip("tests.markdown")
    runner = snippets.Snippets(tmp_path / "project")
    try:
        jobs = runner.run(markdown.Page.read(TUTORIAL))
    except snippets.SnippetError as exc:
        pytest.fail(f"{exc}\n\nWhat ran before:\n" + "\n".join(runner.log[-8:]))
    done = {label: found["completed"] for label, found in jobs.items()}
    for label in ("myapp.ExampleJob", "myapp.ReportJob", "dbworker_tasks.TaskJob"):
        assert done.get(label, 0) >= 1, (label, jobs, "\n".join(runner.log))
    assert all(not found["unfinished"] for found in jobs.values()), jobs
