from django.db import models

from django_dbworker.models import WorkerJob


class BenchJob(WorkerJob):
    """A job with one small column of its own (the key of the per-key limits, 100
    values): the benchmark measures the queue, not the payload."""

    tenant = models.IntegerField(null=True)

    class Meta(WorkerJob.Meta):
        pass


class BenchEvent(models.Model):
    """An append-only table for the ``consumers`` part (benchmarks/consumers.py)."""

    kind = models.CharField(max_length=40, default="Order")
    payload = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"{self.kind} event {self.pk}"


class BenchNote(models.Model):
    """Another model's foreign key to the jobs (``retention --notes``): retention then
    deletes through Django's collector, as ``on_delete`` wants."""

    job = models.ForeignKey(BenchJob, on_delete=models.CASCADE, related_name="notes")

    def __str__(self) -> str:
        return f"note of {self.job_id}"


class OtherBenchJob(WorkerJob):
    """A second job table, on a second server when ``BENCH_SECOND_URL`` is set
    (benchmarks/multidb.py: one worker draining two databases)."""

    tenant = models.IntegerField(null=True)

    class Meta(WorkerJob.Meta):
        pass
