"""django_dbworker: turn any Django model into a reliable job queue."""

from .control.limits import RateLimit
from .control.periodic import Periodic
from .control.unique import period_key, unique_job_constraint
from .exceptions import CancelReason, JobCanceled, NonRetryableError, Snooze, WaitTimeout
from .handler import Handler, current_attempt
from .states import JobState

__all__ = [
    "CancelReason",
    "Handler",
    "JobCanceled",
    "JobState",
    "NonRetryableError",
    "Periodic",
    "RateLimit",
    "Snooze",
    "WaitTimeout",
    "current_attempt",
    "period_key",
    "unique_job_constraint",
]
__version__ = "0.1.0.dev0"
