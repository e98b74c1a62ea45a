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


def run_inner(tmp_path, slowdown):
    """The two tests above with limits of 1 s, in a pytest run of their own."""
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
    return done.stdout + done.stderr


def test_a_limit_of_one_second_stops_a_test_of_one_and_a_half_at_slowdown_1(tmp_path):
    # On a loaded machine the limit may strike in a test's setup (an error, not a
    # failure): either way both end by the limit of 1 s.
    output = run_inner(tmp_path, "1")
    assert output.count("Timeout (>1.0s)") >= 2, output[-2000:]
    assert "passed" not in output.strip().splitlines()[-1], output[-2000:]


def test_the_same_limits_scaled_by_8_let_both_pass(tmp_path):
    output = run_inner(tmp_path, "8")
    assert "2 passed" in output.strip().splitlines()[-1], output[-2000:]


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
