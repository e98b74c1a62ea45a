"""The docs' examples run as written, in a project of their own (issue 42, item 22):
the unique-jobs example of docs/scheduling.md enqueued a field its model lacked."""

import re
import textwrap

import pytest

from tests.conftest import ROOT

from .projects import project  # noqa: F401 - the fixture

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db]


def python_blocks(page, heading):
    """The ```python blocks of the section ``heading`` (## level) of ``page``."""
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else None]
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", section, re.S)]


def test_the_unique_jobs_example_runs(project):  # noqa: F811
    blocks = python_blocks("scheduling.md", "Unique jobs")
    [models] = [b for b in blocks if "class ReportJob(WorkerJob)" in b]
    [enqueue] = [
        b for b in blocks if "ReportJob.objects.enqueue_unique(" in b and "class " not in b
    ]
    project.app("reports", models=models)
    made = project.run("makemigrations", "reports")
    assert made.returncode == 0, made.stderr
    migrated = project.run("migrate")
    assert migrated.returncode == 0, migrated.stderr
    script = (
        "from reports.models import ReportJob\n"
        + enqueue
        + "print(sorted(ReportJob.objects.values_list('kind', 'payload')))\n"
    )
    done = project.run("shell", "-c", script)
    assert done.returncode == 0, done.stderr
    # The second call replaced the payload of the waiting daily job; the third made
    # the hourly one.
    assert done.stdout.strip().splitlines()[-1] == "[('daily', {'v': 2}), ('hourly', {})]"
