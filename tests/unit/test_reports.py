"""The log lines of outcomes."""

import logging
from types import SimpleNamespace

from django_dbworker.runtime.reports import report_completed


def test_a_grouped_completion_line_names_at_most_twenty_jobs(caplog):
    """Under load one statement completes hundreds of jobs: its line listed them all."""
    caplog.set_level(logging.INFO, logger="django_dbworker.writer")
    model = SimpleNamespace(_meta=SimpleNamespace(label="myapp.Job"))
    lane = SimpleNamespace(model=model, worker_id="w:1:a", label="myapp.H")
    items = [(SimpleNamespace(pk=pk), SimpleNamespace(duration=0.001)) for pk in range(370)]
    report_completed(lane, items)  # type: ignore[arg-type]
    [record] = caplog.records
    assert record.getMessage() == (
        "370 jobs of myapp.Job completed in 1 ms–1 ms: "
        + ", ".join(map(str, range(20)))
        + " and 350 more"
    )
    assert record.job_ids == list(range(370))  # type: ignore[attr-defined]
