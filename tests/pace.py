"""How much slower than a quiet machine this one runs: every deadline of the suite
scales by ``SLOWDOWN`` (a pytest plugin: ``tests/conftest.py`` takes its hooks).

A test waits for conditions (a job completed, a worker started) with a deadline, and
pytest-timeout stops a test past its limit. On a 2-core machine with other work beside
the suite (a build, another suite, a browser), everything takes several times longer:
fixed deadlines then fail tests that are right, and a user cannot tell that from a
defect. So deadlines are written for a quiet machine and scaled here:

- ``DBWORKER_TEST_SLOWDOWN`` (a number ≥ 1) sets the factor;
- unset, the factor is the machine's load per core when the run starts (the 1-minute
  load average over the cores), at least 1 and at most ``MOST``; the controller sets
  the variable so that every xdist worker uses the same factor.

What it scales: ``wait_until``'s deadline, the waits of the worker helpers
(``ThreadedWorker``, ``WorkerProcess``, ``projects.Project``), and every test's
pytest-timeout limit (a ``timeout`` mark, or the ini's). It never scales what a test
asserts about speed: the suite has no timing targets (benchmarks have).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

VARIABLE = "DBWORKER_TEST_SLOWDOWN"
#: The most the load scales deadlines by on its own (the variable may set more).
MOST = 4.0


def measured() -> float:
    """The load per core now, within 1 and ``MOST``."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return 1.0
    return min(max(load, 1.0), MOST)


def factor() -> float:
    """The factor of this run: the variable's, else measured now (and remembered)."""
    given = os.environ.get(VARIABLE)
    if given:
        try:
            return max(float(given), 1.0)
        except ValueError:
            raise pytest.UsageError(f"{VARIABLE} must be a number, not {given!r}") from None
    found = measured()
    os.environ[VARIABLE] = f"{found:.2f}"  # xdist workers and subprocesses inherit it
    return found


SLOWDOWN = factor()


def scaled(seconds: float) -> float:
    """``seconds`` of a quiet machine, on this one."""
    return seconds * SLOWDOWN


def pytest_report_header(config: pytest.Config) -> str:
    return f"dbworker: deadlines scaled by {SLOWDOWN:.2f} ({VARIABLE})"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's pytest-timeout limit, scaled: its closest ``timeout`` mark, or the
    ini's ``timeout``, becomes a mark of its own that pytest-timeout reads first."""
    if SLOWDOWN == 1.0:
        return
    default = _ini_timeout(config)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = _seconds(marker) if marker is not None else default
        if seconds:
            kwargs: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
            kwargs.pop("timeout", None)
            item.add_marker(pytest.mark.timeout(scaled(seconds), **kwargs), append=False)


def _ini_timeout(config: pytest.Config) -> float:
    try:
        return float(config.getini("timeout") or 0)
    except (ValueError, KeyError):
        return 0.0


def _seconds(marker: pytest.Mark) -> float:
    value = marker.args[0] if marker.args else marker.kwargs.get("timeout", 0)
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0
