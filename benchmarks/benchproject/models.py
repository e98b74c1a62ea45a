from django.db import models

from django_dbworker.models import WorkerJob


class BenchJob(WorkerJob):
    """A job with one small column of its own (the key of the per-key limits, 100
    values): the benchmark measures the queue, not the payload."""

    tenant = models.IntegerField(null=True)

    class Meta(WorkerJob.Meta):
        pass
