"""django_dbworker: turn any Django model into a reliable job queue."""

from .exceptions import CancelReason, JobCanceled, NonRetryableError
from .handler import Handler, current_attempt
from .states import JobState

__all__ = [
    "CancelReason",
    "Handler",
    "JobCanceled",
    "JobState",
    "NonRetryableError",
    "current_attempt",
]
__version__ = "0.1.0.dev0"
