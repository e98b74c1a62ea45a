"""The admin: the operations console.

``WorkerJobAdmin`` (``jobs``, with its operations in ``actions``, its filters in
``filters`` and its columns in ``display``) for your job models, the
live-workers view (``workers``), and the controls (``controls``: pauses and
the audit trail; ``schedules``), registered on import.
What users import from ``django_dbworker.admin`` stays importable from here.
"""

from .actions import JOB_OPERATIONS, JobOperation, ScheduleForm
from .consumers import ConsumerCheckpointAdmin, ConsumerGapSkipAdmin
from .controls import AuditEntryAdmin, PauseAdmin
from .filters import CancelRequestedFilter, StalledFilter, WorkerHostnameFilter, stalled_max_age
from .jobs import WorkerJobAdmin
from .schedules import ScheduleAdmin
from .workers import WorkerProcessAdmin

__all__ = [
    "JOB_OPERATIONS",
    "AuditEntryAdmin",
    "CancelRequestedFilter",
    "ConsumerCheckpointAdmin",
    "ConsumerGapSkipAdmin",
    "JobOperation",
    "PauseAdmin",
    "ScheduleAdmin",
    "ScheduleForm",
    "StalledFilter",
    "WorkerHostnameFilter",
    "WorkerJobAdmin",
    "WorkerProcessAdmin",
    "stalled_max_age",
]
