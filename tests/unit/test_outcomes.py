"""The outcome of an attempt, decided without a database."""

from types import SimpleNamespace

import pytest

from django_dbworker import NonRetryableError
from django_dbworker.exceptions import CancelReason
from django_dbworker.runtime.execution import decide
from django_dbworker.runtime.outcome import Outcome, OutcomeKind
from django_dbworker.states import TRANSITIONS
from tests.testapp.handlers import BehaviorHandler

HANDLER = BehaviorHandler(max_num_retries=2, retry_after=10, retry_backoff=2)


@pytest.mark.parametrize(
    ("reason", "error", "failures", "kind"),
    [
        (None, None, 0, OutcomeKind.COMPLETED),
        (CancelReason.CANCELED, None, 0, OutcomeKind.COMPLETED),  # returned: its work is done
        (None, RuntimeError("x"), 0, OutcomeKind.ERRORED),
        (None, RuntimeError("x"), 2, OutcomeKind.FAILED),  # budget spent
        (None, NonRetryableError("x"), 0, OutcomeKind.FAILED),
        (CancelReason.CANCELED, RuntimeError("x"), 0, OutcomeKind.CANCELED),
        (CancelReason.LOST, RuntimeError("x"), 0, OutcomeKind.LOST),
        (CancelReason.LOST, None, 0, OutcomeKind.LOST),
        (CancelReason.SHUTDOWN, RuntimeError("x"), 5, OutcomeKind.REQUEUED),
        (CancelReason.NO_HEARTBEAT, RuntimeError("x"), 0, OutcomeKind.REQUEUED),
        (CancelReason.TIMEOUT, RuntimeError("x"), 0, OutcomeKind.ERRORED),
        (CancelReason.TIMEOUT, RuntimeError("x"), 2, OutcomeKind.FAILED),
        # Past its maximum runtime a return does not complete the job (issue 42, item 13).
        (CancelReason.TIMEOUT, None, 0, OutcomeKind.ERRORED),
        (CancelReason.TIMEOUT, None, 2, OutcomeKind.FAILED),
    ],
)
def test_decide(reason, error, failures, kind):
    outcome = decide(HANDLER, reason, error, failures, max_runtime=1.5)
    assert outcome.kind is kind
    assert outcome.state == kind.state


def test_a_timeout_says_so_and_errors_are_retried_with_backoff():
    outcome = decide(HANDLER, CancelReason.TIMEOUT, RuntimeError("slow"), 1, max_runtime=1.5)
    assert outcome.message.startswith("exceeded the maximum runtime of 1.5s")
    assert outcome.retry_delay == 20  # retry_after 10, doubled for the second failure


def test_a_timeout_says_whether_the_handler_returned_or_was_left_running():
    returned = decide(HANDLER, CancelReason.TIMEOUT, None, 0, max_runtime=1.5)
    assert returned.message == (
        "exceeded the maximum runtime of 1.5s (maximum_runtime_per_job); "
        "the handler returned after it"
    )
    running = decide(HANDLER, CancelReason.TIMEOUT, None, 0, max_runtime=1.5, running=True)
    assert "its thread was left running" in running.message
    assert running.kind is OutcomeKind.ERRORED


def test_is_retryable_raising_means_retry():
    class Broken(BehaviorHandler):
        def is_retryable(self, error):
            raise ValueError("broken")

    outcome = decide(Broken(max_num_retries=1), None, RuntimeError("x"), 0, None)
    assert outcome.kind is OutcomeKind.ERRORED


def test_each_kind_writes_through_a_statement_of_the_transition_table():
    for kind in OutcomeKind:
        if kind is OutcomeKind.LOST:
            assert kind.statement is None
            continue
        _sources, targets = TRANSITIONS[kind.statement]
        assert kind.state in targets, kind


def test_constructors():
    error = RuntimeError("x")
    assert Outcome.completed().kind is OutcomeKind.COMPLETED
    assert Outcome.canceled("m", error).error is error
    assert Outcome.requeued("m").state == "queued"
    assert Outcome.lost().state == "lost"
    assert Outcome.failed(error, "m", non_retryable=True).non_retryable
    assert Outcome.errored(error, "m", 3.0).retry_delay == 3.0
    assert SimpleNamespace(state=Outcome.errored(error, "m", 1).state).state == "errored"
