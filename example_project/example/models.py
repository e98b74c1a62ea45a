from django.db import models

from django_dbworker.models import WorkerJob


class Repository(models.Model):
    name = models.CharField(max_length=200)
    url = models.URLField()

    class Meta:
        verbose_name_plural = "repositories"

    def __str__(self) -> str:
        return self.name


class ExampleJob(WorkerJob):
    """Index one repository. ``fail_times`` makes the demo show retries."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE)
    seconds = models.FloatField(default=0.2, help_text="How long the fake indexing takes.")
    fail_times = models.PositiveIntegerField(
        default=0, help_text="The first attempts that fail, to show retries."
    )

    class Meta(WorkerJob.Meta):
        pass


class OutboxMessage(models.Model):
    """Written in the same transaction as the change it announces; OutboxRelay publishes it."""

    topic = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"{self.topic} {self.pk}"
