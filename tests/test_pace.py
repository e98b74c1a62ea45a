"""Deadlines scale with the machine (tests/pace.py): a test's pytest-timeout limit, and
``wait_until``'s deadline, are written for a quiet machine and multiplied by
``DBWORKER_TEST_SLOWDOWN`` (by default the load per core when the run starts)."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import pace

pytestmark = pytest.mark.subprocess

TESTS = """
import time

import pytest


@pytest.mark.timeout(1)
def test_marked():
    time.sleep(1.6)


def test_ini_limit():
    time.sleep(1.6)
"""


@pytest.mark.parametrize(("slowdown", "summary"), [("1", "2 failed"), ("2.5", "2 passed")])
def test_the_limits_of_a_run_scale_by_its_slowdown(tmp_path, slowdown, summary):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 1\ntimeout_method = signal\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))},
        "PYTHONPATH": root,
        "DBWORKER_TEST_SLOWDOWN": slowdown,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.pace", "-p", "no:randomly"]
        + ["-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:django", "-q", "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert summary in done.stdout.strip().splitlines()[-1], done.stdout[-2000:] + done.stderr


def test_the_factor_comes_from_the_variable_or_the_load(monkeypatch):
    monkeypatch.setenv(pace.VARIABLE, "3")
    assert pace.factor() == 3.0
    monkeypatch.setenv(pace.VARIABLE, "0.5")
    assert pace.factor() == 1.0  # never faster than a quiet machine
    monkeypatch.delenv(pace.VARIABLE)
    assert 1.0 <= pace.factor() <= pace.MOST
    assert os.environ[pace.VARIABLE]  # remembered for the workers the run starts
    monkeypatch.setenv(pace.VARIABLE, "fast")
    with pytest.raises(pytest.UsageError):
        pace.factor()
