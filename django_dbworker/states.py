"""Job states. Kept apart from ``models`` so it imports before the app registry is ready."""

from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued", "queued"
    PROCESSING = "processing", "processing"
    COMPLETED = "completed", "completed"
    ERRORED = "errored", "errored"
    FAILED = "failed", "failed"
    CANCELED = "canceled", "canceled"


#: States a worker may claim from (``errored`` only once its retry time has come).
DEQUEUEABLE_STATES = (JobState.QUEUED, JobState.ERRORED)
#: States a job never leaves on its own.
FINAL_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELED)

Q, P, C, E, F, X = (
    JobState.QUEUED,
    JobState.PROCESSING,
    JobState.COMPLETED,
    JobState.ERRORED,
    JobState.FAILED,
    JobState.CANCELED,
)

#: Every move the engine makes, by the statement that makes it: (the states it takes a
#: row from, the states it may leave it in). A statement never touches a row in another
#: state; ``tests/test_transitions.py`` runs each against a row in every state.
#: Worker statements (``sql.jobs``) first, then the operator's (``operations``).
TRANSITIONS: dict[str, tuple[frozenset[JobState], frozenset[JobState]]] = {
    "claim": (frozenset({Q, E}), frozenset({P})),
    # Rows that waited for a time and came due: claimable from now on (same state).
    "stage": (frozenset({Q, E}), frozenset({Q, E})),
    "heartbeat": (frozenset({P}), frozenset({P})),
    "log_set": (frozenset({P}), frozenset({P})),
    "complete": (frozenset({P}), frozenset({C})),
    # An error, decided by the row: canceled if its cancel flag is set, failed once its
    # retry budget is spent (or it is not retryable), else errored.
    "error": (frozenset({P}), frozenset({E, F, X})),
    "cancel": (frozenset({P}), frozenset({X})),
    # A snooze (``raise Snooze``): back to the queue for a time, canceled if its cancel
    # flag is set.
    "snooze": (frozenset({P}), frozenset({Q, X})),
    "requeue": (frozenset({P}), frozenset({Q})),
    "requeue_unheld": (frozenset({P}), frozenset({Q})),
    "reset_stalled": (frozenset({P}), frozenset({Q})),
    "reset_one": (frozenset({P}), frozenset({Q})),
    # A job coming back to waiting while another job waits with its waiting-only unique
    # key is superseded by it (``sql.superseding``): this worker's, or a stalled one.
    "supersede": (frozenset({P}), frozenset({X})),
    "supersede_stalled": (frozenset({P}), frozenset({X})),
    "fail_stalled": (frozenset({P}), frozenset({F})),
    # Retention: finished rows are deleted (None: gone).
    "prune": (frozenset({C, F, X}), frozenset()),
    # Queued and errored jobs are canceled; a processing one gets its cancel flag.
    "operator_cancel": (frozenset({Q, E, P}), frozenset({X, P})),
    "operator_retry": (frozenset({F, E, X}), frozenset({Q})),
    "operator_run_now": (frozenset({Q, E}), frozenset({Q, E})),
    "operator_schedule": (frozenset({Q, E}), frozenset({Q, E})),
}
del Q, P, C, E, F, X
