"""A test that pytest-timeout stops does not fail the next one (tests/timeouts.py): the
run of the model-based test killed at its limit left its connection mid-query, and
the next test on that xdist worker failed with "another command is already in
progress"."""

import os
import subprocess
import sys
import textwrap

import pytest
from django.db import connection

from tests import conftest
from tests.conftest import ROOT

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="psycopg is the driver a signal leaves mid-query (SQLite's and "
        "MySQLdb's calls finish before Python's signal handler runs)",
    ),
]

SETTINGS = """
import environ
SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = []
DATABASES = {{"default": environ.Env.db_url_config({url!r})}}
"""

TESTS = """
import pytest
from django.db import connection


@pytest.mark.django_db(transaction=True)
def test_0_the_database_is_set_up():
    pass


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(2)
def test_1_a_query_past_the_limit():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(60)")


@pytest.mark.django_db(transaction=True)
def test_2_the_next_test():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
"""


def test_a_timed_out_query_does_not_fail_the_next_test(tmp_path):
    # A database name of its own, made from this session's (one per xdist worker).
    url = f"{conftest.test_database_url()}_timeouts"
    (tmp_path / "innersettings.py").write_text(SETTINGS.format(url=url))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(TESTS))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))},
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "DJANGO_SETTINGS_MODULE": "innersettings",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.timeouts",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "--rootdir",
            str(tmp_path),
            "test_inner.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert "1 failed, 2 passed" in summary, done.stdout[-3000:] + done.stderr[-2000:]
    assert "FAILED test_inner.py::test_1_a_query_past_the_limit - Failed: Timeout" in done.stdout
