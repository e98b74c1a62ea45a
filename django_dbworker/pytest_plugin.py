"""The ``dbworker`` pytest fixture (registered through the ``pytest11`` entry point).

This module imports nothing of Django at import time: pytest loads it before Django
is set up. The fixture needs pytest-django's ``db`` fixture, so database access.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest


@pytest.fixture
def dbworker(db: Any) -> SimpleNamespace:
    """Run and inspect queued jobs in the test's transaction: ``dbworker.run(handler)``,
    ``dbworker.run_tasks()``, ``dbworker.enqueued(...)``, ``dbworker.assert_enqueued(...)``."""
    from . import testing

    return SimpleNamespace(
        run=testing.run_jobs,
        run_tasks=testing.run_tasks,
        enqueued=testing.enqueued,
        assert_enqueued=testing.assert_enqueued,
    )
