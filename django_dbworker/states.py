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
