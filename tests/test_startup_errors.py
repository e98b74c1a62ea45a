"""What ``runworker`` says at start about a database it can never use and a table its
model outgrew (issue 42, item 21): a database that does not exist or refuses the role
fails at once (a server that is down is still waited for: tests/test_commands.py), and
a field added without a migration says ``makemigrations`` before ``migrate``."""

import textwrap
import time
from types import SimpleNamespace

import pytest
from django.db import connection

from django_dbworker.sql.lasting import lasting_problem

from .projects import project  # noqa: F401 - the fixture

MODELS = """
from django.db import models
from django_dbworker.models import WorkerJob


class Job(WorkerJob):
    pass
"""

MODELS_WITH_A_FIELD = (
    MODELS
    + """
    size = models.IntegerField(default=0)
"""
)

HANDLERS = """
from django_dbworker import Handler

from .models import Job


class JobHandler(Handler):
    model = Job
    interval = 0.05

    def handle(self, job):
        pass
"""


def elsewhere(url, vendor, root):
    """``url`` with a database name that does not exist (SQLite: a file in a directory
    that does not exist)."""
    if vendor == "sqlite":
        return f"sqlite:///{root / 'no-such-directory' / 'db.sqlite3'}"
    return url.rsplit("/", 1)[0] + "/dbw_h7_no_such_database"


def run_against(project, url, *args):  # noqa: F811
    project.database_url = url
    started = time.monotonic()
    done = project.run(
        "runworker", "jobs.handlers.JobHandler", "--burst", "--startup-timeout", "20", *args
    )
    return done, time.monotonic() - started


@pytest.mark.subprocess
def test_a_database_that_does_not_exist_fails_at_once(project, tmp_path):  # noqa: F811
    """It was retried for the whole startup timeout (60 s by default) as "unreachable"."""
    project.app("jobs", models=MODELS, handlers=HANDLERS)
    done, took = run_against(project, elsewhere(project.database_url, connection.vendor, tmp_path))
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("CommandError: cannot use database 'default': "), done.stderr
    if connection.vendor == "sqlite":
        assert f"the directory {tmp_path / 'no-such-directory'} of its file does not exist" in last
    else:
        assert "the database does not exist" in last
    assert "retrying in" not in done.stderr
    assert "unreachable" not in done.stderr
    assert took < 20


@pytest.mark.subprocess
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's roles")
def test_a_role_the_server_does_not_know_fails_at_once(project):  # noqa: F811
    project.app("jobs", models=MODELS, handlers=HANDLERS)
    url = project.database_url.replace("postgres@", "dbw_h7_no_such_role@", 1)
    assert url != project.database_url
    done, _ = run_against(project, url)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("CommandError: cannot use database 'default': the role does not"), last
    assert "retrying in" not in done.stderr


def fake(vendor, **settings):
    return SimpleNamespace(vendor=vendor, settings_dict=settings)


class Refused(Exception):
    def __init__(self, *args, sqlstate=None):
        super().__init__(*args)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("vendor", "error", "expected"),
    [
        ("postgresql", Refused("x", sqlstate="3D000"), "the database does not exist"),
        ("postgresql", Refused("x", sqlstate="28P01"), "the server refuses the password"),
        ("postgresql", Refused("x", sqlstate="28000"), "the server refuses the role"),
        (
            "postgresql",
            Refused('failed: FATAL:  password authentication failed for user "app"'),
            "the server refuses the password",
        ),
        (
            "postgresql",
            Refused('failed: FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "app"'),
            "the server's pg_hba.conf has no entry for this client",
        ),
        ("postgresql", Refused("failed: fe_sendauth: no password supplied"), "none is set"),
        ("postgresql", Refused("failed: Connection refused"), None),
        ("postgresql", Refused("FATAL:  the database system is starting up"), None),
        ("postgresql", Refused("FATAL:  sorry, too many clients already"), None),
        ("mysql", Refused(1049, "Unknown database 'app'"), "the database does not exist"),
        ("mysql", Refused(1045, "Access denied for user 'app'"), "refuses the user or password"),
        ("mysql", Refused(2003, "Can't connect to MySQL server"), None),
        ("mysql", Refused(1040, "Too many connections"), None),
    ],
)
def test_what_waiting_cannot_fix(vendor, error, expected):
    found = lasting_problem(error, fake(vendor))
    if expected is None:
        assert found is None
    else:
        assert expected in found


def test_a_django_error_is_read_through_its_cause():
    wrapped = Exception("wrapped")
    wrapped.__cause__ = Refused(1049, "Unknown database 'app'")
    assert lasting_problem(wrapped, fake("mysql")) == "the database does not exist"


def test_sqlite_fails_at_once_only_for_a_missing_directory(tmp_path):
    error = Exception("unable to open database file")
    missing = fake("sqlite", NAME=str(tmp_path / "nowhere" / "db.sqlite3"))
    assert "does not exist" in lasting_problem(error, missing)
    assert lasting_problem(error, fake("sqlite", NAME=str(tmp_path / "db.sqlite3"))) is None


@pytest.mark.subprocess
def test_a_field_without_a_migration_says_makemigrations_then_migrate(project):  # noqa: F811
    """It said "run migrate", which answers "No migrations to apply"."""
    path = project.app("jobs", models=MODELS, handlers=HANDLERS)
    assert project.run("makemigrations", "jobs").returncode == 0
    assert project.run("migrate").returncode == 0
    (path / "models.py").write_text(textwrap.dedent(MODELS_WITH_A_FIELD))

    done = project.run("runworker", "jobs.handlers.JobHandler", "--burst")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "CommandError: jobs_job lacks columns size of jobs.Job: the model has changes no "
        "migration holds: run `python manage.py makemigrations jobs`, then "
        "`python manage.py migrate`"
    ), done.stderr

    assert project.run("makemigrations", "jobs").returncode == 0
    done = project.run("runworker", "jobs.handlers.JobHandler", "--burst")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "CommandError: jobs_job lacks columns size of jobs.Job: run `python manage.py "
        "migrate` (not applied: jobs.0002_job_size)"
    ), done.stderr

    assert project.run("migrate").returncode == 0
    done = project.run("runworker", "jobs.handlers.JobHandler", "--burst")
    assert done.returncode == 0, done.stderr
