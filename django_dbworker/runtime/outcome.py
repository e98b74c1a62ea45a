"""What an attempt ends in: a typed outcome, one constructor per kind.

Each kind names the statement that writes it (``sql.jobs``), and that
statement's moves are in ``states.TRANSITIONS``. ``post_handle`` sees the
outcome once it is written, its ``state`` then the state the row took.
"""

from __future__ import annotations

import dataclasses
import enum
import traceback

from .. import conf
from ..states import JobState


class OutcomeKind(enum.Enum):
    """(the state it asks for, the statement that writes it; None: nothing)."""

    COMPLETED = (JobState.COMPLETED.value, "complete")
    ERRORED = (JobState.ERRORED.value, "error")
    FAILED = (JobState.FAILED.value, "error")
    CANCELED = (JobState.CANCELED.value, "cancel")
    REQUEUED = (JobState.QUEUED.value, "requeue")
    #: Back to the queue for ``retry_delay`` seconds (``raise Snooze``): nothing counted
    #: but ``num_snoozes``.
    SNOOZED = (JobState.QUEUED.value, "snooze")
    #: The row is no longer this attempt's (deleted, or reset and claimed again).
    LOST = ("lost", None)

    @property
    def state(self) -> str:
        return _STATES[self]

    @property
    def statement(self) -> str | None:
        statement: str | None = self.value[1]
        return statement


#: Each kind's state, looked up without the enum's ``value`` (each outcome asks).
_STATES: dict[OutcomeKind, str] = {kind: kind.value[0] for kind in OutcomeKind}


@dataclasses.dataclass
class Outcome:
    """What the worker writes for an attempt, as ``post_handle`` sees it.

    ``state`` is one of ``completed``, ``errored``, ``failed``, ``canceled``,
    ``queued`` (requeued or snoozed: ``kind`` tells) or ``lost`` (the row is no longer
    ours: nothing is written); once written, the state the row took.
    """

    kind: OutcomeKind
    error: BaseException | None = None
    message: str | None = None
    retry_delay: float = 0.0
    non_retryable: bool = False
    duration: float = 0.0
    state: str = ""
    #: What ``handle()`` returned, as JSON text (handlers with a ``result_field``).
    result: str | None = None
    #: The job's retry budget (``Handler.retry_budget``), for the error statement.
    budget: int | None = None

    def __post_init__(self) -> None:
        self.state = self.state or _STATES[self.kind]

    @classmethod
    def completed(cls, result: str | None = None) -> Outcome:
        return cls(OutcomeKind.COMPLETED, result=result)

    @classmethod
    def errored(
        cls, error: BaseException, message: str, retry_delay: float, budget: int | None = None
    ) -> Outcome:
        """Retried after ``retry_delay`` (unless the row's budget is spent, or it was
        canceled meanwhile: the statement decides)."""
        return cls(OutcomeKind.ERRORED, error, message, retry_delay=retry_delay, budget=budget)

    @classmethod
    def failed(
        cls,
        error: BaseException,
        message: str,
        *,
        non_retryable: bool,
        retry_delay: float = 0.0,
        budget: int | None = None,
    ) -> Outcome:
        return cls(
            OutcomeKind.FAILED,
            error,
            message,
            retry_delay=retry_delay,
            non_retryable=non_retryable,
            budget=budget,
        )

    @classmethod
    def canceled(cls, message: str, error: BaseException | None = None) -> Outcome:
        return cls(OutcomeKind.CANCELED, error, message)

    @classmethod
    def requeued(cls, message: str, error: BaseException | None = None) -> Outcome:
        """Back to the queue, unrun or stopped: nothing counted."""
        return cls(OutcomeKind.REQUEUED, error, message)

    @classmethod
    def snoozed(cls, seconds: float, message: str) -> Outcome:
        """Back to the queue until ``seconds`` pass (``raise Snooze``): no failure, no
        retry used; ``num_snoozes`` counts it."""
        return cls(OutcomeKind.SNOOZED, None, message, retry_delay=seconds)

    @classmethod
    def lost(cls, error: BaseException | None = None) -> Outcome:
        return cls(OutcomeKind.LOST, error)


def clean_text(text: str, limit: int) -> str:
    """Text fit for a text/JSON column: no NUL, at most ``limit`` characters."""
    text = text.replace("\x00", "\ufffd")
    if len(text) > limit:
        cut = len(text) - limit
        text = text[:limit] + f"\n… [{cut} more characters cut]"
    return text


def failure_message(error: BaseException, prefix: str = "") -> str:
    """``Type: message`` on the first line, then the traceback; capped."""
    try:
        text = str(error)
    except Exception as exc:  # a broken __str__ must not cost the job its outcome
        text = f"<str() failed: {type(exc).__name__}>"
    head = f"{prefix}{type(error).__name__}: {text}" if text else f"{prefix}{type(error).__name__}"
    body = "".join(traceback.format_exception(error))
    return clean_text(f"{head}\n\n{body}", conf.get("MAX_FAILURE_MESSAGE_LENGTH"))
