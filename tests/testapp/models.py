from django.db import models

from django_dbworker.models import WorkerJob, dequeue_index


class Repository(models.Model):
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


class QueueJob(WorkerJob):
    """A job whose ``behavior`` and ``payload`` tell the test handler what to do."""

    repository = models.ForeignKey(Repository, null=True, blank=True, on_delete=models.CASCADE)
    behavior = models.CharField(max_length=40, default="ok")
    payload = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    size = models.IntegerField(default=1)

    class Meta(WorkerJob.Meta):
        indexes = [
            *WorkerJob.Meta.indexes,
            dequeue_index("-priority", "id", name="testapp_queuejob_prio_dq"),
        ]


class Event(models.Model):
    """What handlers did, in order: hooks, attempts, outcomes (for assertions)."""

    job_id = models.BigIntegerField(db_index=True)
    kind = models.CharField(max_length=40)
    worker = models.CharField(max_length=255, default="")
    token = models.CharField(max_length=64, default="")
    at = models.FloatField(default=0.0)
    detail = models.TextField(default="", blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}"
