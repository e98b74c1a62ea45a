"""The docs as a reader meets them: every relative link of the README and of docs/
resolves (file and heading), none points to the unpublished repository's address, and
the README's and the tutorial's snippets run in a fresh project (docs/architecture.md
§ Tests: the snippet conventions)."""

import subprocess
import sys
import textwrap

import pytest
from django.db import connection

from tests.conftest import ROOT
from tests.markdown import Page, broken_links, slug
from tests.snippets import SnippetError, Snippets, extend_settings

PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_link_of_the_readme_and_the_docs_resolves():
    broken = broken_links(PAGES, ROOT)
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Run it yourself", "run-it-yourself"),
        ("Tasks through `django.tasks`", "tasks-through-djangotasks"),
        ("Consumers: events/s of one consumer", "consumers-eventss-of-one-consumer"),
        ("On MariaDB (issue 32)", "on-mariadb-issue-32"),
        ("Wake-ups: LISTEN/NOTIFY and polling", "wake-ups-listennotify-and-polling"),
        ("`DBWORKER_PLANS_ROWS` and µs ≥ 2×", "dbworker_plans_rows-and-µs--2"),
        ("See [the admin](admin.md) **now**", "see-the-admin-now"),
    ],
)
def test_anchors_are_made_as_github_makes_them(heading, anchor):
    assert slug(heading) == anchor


def test_the_link_check_reports_each_kind_of_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Figures\n\n## Figures\n")
    page = tmp_path / "README.md"
    page.write_text(
        textwrap.dedent(
            """\
            # Title

            ## A `code` heading

            [ok](docs/other.md) [ok](docs/other.md#figures) [ok](docs/other.md#figures-1)
            [ok](#a-code-heading) [ok](#title) [external](https://example.com/x#y)
            [gone](docs/missing.md) [anchor](docs/other.md#figures-2) [self](#nothing)
            [pub](https://github.com/django-dbworker/django-dbworker/blob/main/docs/other.md)
            `[in code](docs/missing.md)`

            ```
            [in a block](docs/missing.md)
            # not a heading
            ```
            [after](#not-a-heading)

            ```
            pip install "x @ git+https://github.com/django-dbworker/django-dbworker.git"
            ```
            """
        )
    )
    assert [line.split(": ", 1)[1] for line in broken_links([page], tmp_path)] == [
        "docs/missing.md: no such file",
        "docs/other.md#figures-2: no heading of other.md has this anchor",
        "#nothing: no heading of README.md has this anchor",
        "https://github.com/django-dbworker/django-dbworker/blob/main/docs/other.md: "
        "the project is not published there: link relatively",
        "#not-a-heading: no heading of README.md has this anchor",
        'pip install "x @ git+https://github.com/django-dbworker/django-dbworker.git": '
        "the project is not published there",
    ]


def test_blocks_carry_their_marker_and_lose_their_indentation(tmp_path):
    path = tmp_path / "page.md"
    path.write_text(
        textwrap.dedent(
            """\
            <!-- snippet: skip -->
            ```python
            skipped()
            ```

            - an item:

              <!-- snippet: skip -->

              ```python
              # myapp/models.py
              indented = True
              ```
            - text between

            ```
            python manage.py migrate
            ```
            """
        )
    )
    blocks = Page.read(path).blocks()
    assert [(b.info, b.marker, b.lines) for b in blocks] == [
        ("python", "skip", ["skipped()"]),
        ("python", "skip", ["# myapp/models.py", "indented = True"]),
        ("", None, ["python manage.py migrate"]),
    ]


def test_a_settings_part_extends_the_lists_it_writes_with_an_ellipsis():
    source = 'INSTALLED_APPS = [..., "django_dbworker", "myapp"]\nDBWORKER = {"A": 1}\n'
    assert extend_settings(source, "x") == (
        "INSTALLED_APPS = [*INSTALLED_APPS, 'django_dbworker', 'myapp']\nDBWORKER = {'A': 1}\n"
    )
    with pytest.raises(SnippetError, match="cannot merge"):
        extend_settings('TASKS = {"default": {...}}\n', "x")


def test_the_benchmark_harness_starts_without_mysqlclient():
    """docs/benchmarks.md's commands need the `bench` group, not MariaDB's driver: the
    harness imported MySQLdb at start, so `python -m benchmarks --help` failed where
    mysqlclient is not installed (the `mysql` group is only for MariaDB)."""
    code = (
        "import runpy, sys; sys.modules['MySQLdb'] = None; sys.argv = ['benchmarks', '--help'];"
        " runpy.run_module('benchmarks', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--systems" in done.stdout


@pytest.mark.subprocess
@pytest.mark.timeout(240)
@pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="the fresh project runs on SQLite whatever the suite's database: once is enough",
)
@pytest.mark.parametrize("page", ["README.md", "docs/tutorial.md"])
def test_the_snippets_of_the_page_run_in_a_fresh_project(page, tmp_path):
    snippets = Snippets(tmp_path / "project")
    try:
        jobs = snippets.run(Page.read(ROOT / page))
    except SnippetError as exc:
        pytest.fail(f"{exc}\n\nWhat ran before:\n" + "\n".join(snippets.log[-8:]))
    assert jobs, "the page declares no job model"
    unfinished = {label: found["unfinished"] for label, found in jobs.items()}
    unfinished = {label: rows for label, rows in unfinished.items() if rows}
    assert unfinished == {}, "\n".join(snippets.log)
    assert sum(found["completed"] for found in jobs.values()) > 0, "\n".join(snippets.log)
