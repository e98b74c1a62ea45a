from django_dbworker.models import WorkerJob


class BenchJob(WorkerJob):
    """A job with no columns of its own: the benchmark measures the queue, not the payload."""

    class Meta(WorkerJob.Meta):
        pass
