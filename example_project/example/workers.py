from datetime import timedelta

from django_dbworker import Handler

from .models import ExampleJob


class ExampleHandler(Handler):
    model = ExampleJob
    ordering = ("repository_id", "id")
    num_handlers = 4  # its ceiling in the shared pool (DBWORKER["POOL"])
    weight = 100
    max_num_retries = 3
    retry_after = timedelta(seconds=1)
    stalled_max_age = timedelta(seconds=5)
    max_num_resets = 5

    def get_queryset(self):
        return super().get_queryset().select_related("repository")

    def handle(self, job):
        repo = job.repository
        with self.attempt.log("clone", ["git", "clone", repo.url]) as entry:
            if self.attempt.wait(job.seconds / 2):  # returns early if the job is cancelled
                self.attempt.raise_if_canceled()
            entry.update(out=f"Cloning into '{repo.name}'...\ndone.\n")
        with self.attempt.log("index", ["indexer", "--repo", repo.name]) as entry:
            if job.num_failures < job.fail_times:
                entry.update(out="error: connection reset by peer\n", exit_code=1)
                raise ConnectionError(
                    f"indexing {repo.name} failed (attempt {job.num_failures + 1})"
                )
            self.attempt.wait(job.seconds / 2)
            entry.update(out=f"indexed {repo.name}: 42 files\n")
