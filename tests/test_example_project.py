"""The example project's own commands (what `make demo` runs), as subprocesses."""

import os
import subprocess
import sys

import pytest
from django.db import connection

from tests.conftest import ROOT


def manage(*args, database_url):
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "example_project.settings",
            "DATABASE_URL": database_url,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["2.5"], "count must be a whole number >= 1, not '2.5'"),
        (["--seconds", "inf"], "--seconds must be a number >= 0, not 'inf'"),
        (["--failing", "nan"], "--failing must be a number from 0 to 1, not 'nan'"),
    ],
)
def test_the_example_projects_enqueue_command_refuses_bad_numbers(tmp_path, args, message):
    result = manage(
        "enqueue_demo_jobs", *args, database_url=f"sqlite:///{tmp_path / 'example.sqlite3'}"
    )
    assert result.returncode == 1
    assert result.stderr.strip() == f"CommandError: {message}"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite needs no database")
@pytest.mark.django_db
def test_create_demo_database_creates_a_missing_postgresql_database():
    """`DATABASE_URL=postgres://…/name make demo` failed when `name` did not exist."""
    name = f"{connection.settings_dict['NAME']}_demo"
    settings = connection.settings_dict
    url = (
        f"postgres://{settings['USER']}@{settings['HOST'] or '127.0.0.1'}:"
        f"{settings['PORT'] or 5432}/{name}"
    )

    def drop():
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)}")

    drop()
    try:
        result = manage("create_demo_database", database_url=url)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"created PostgreSQL database {name!r}")
        result = manage("create_demo_database", database_url=url)
        assert result.stdout.startswith(f"PostgreSQL database {name!r}")
        assert result.stdout.rstrip().endswith("exists")
        assert manage("migrate", "--verbosity", "0", database_url=url).returncode == 0
    finally:
        drop()


def test_create_demo_database_says_in_one_line_when_it_cannot():
    result = manage(
        "create_demo_database", database_url="postgres://postgres@127.0.0.1:1/dbw_cmds_nowhere"
    )
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("CommandError: cannot create PostgreSQL database 'dbw_cmds_nowhere'")
    assert "create it yourself (`createdb -h 127.0.0.1 -p 1 -U postgres dbw_cmds_nowhere`)" in line


def test_create_demo_database_has_nothing_to_do_on_sqlite(tmp_path):
    result = manage("create_demo_database", database_url=f"sqlite:///{tmp_path / 'demo.sqlite3'}")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
