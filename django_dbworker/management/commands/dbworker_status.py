from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand
from django.db.models import Count

from django_dbworker.models import WorkerJob, WorkerProcess
from django_dbworker.states import JobState


class Command(BaseCommand):
    help = "Print how many jobs each job table holds per state, and the live workers."

    def handle(self, *args: Any, **options: Any) -> None:
        states = list(JobState.values)
        self.stdout.write(f"{'job model':32}" + "".join(f"{s:>12}" for s in states))
        for model in apps.get_models():
            if not issubclass(model, WorkerJob):
                continue
            counts = dict(
                model._base_manager.values_list("state").annotate(n=Count("pk")).order_by()
            )
            row = "".join(f"{counts.get(s, 0):>12}" for s in states)
            self.stdout.write(f"{model._meta.label:32}{row}")
        workers = list(WorkerProcess.objects.all())
        self.stdout.write(f"\n{len(workers)} worker process(es) registered")
        for worker in workers:
            self.stdout.write(
                f"  {worker.worker_id}  jobs in flight: {worker.num_jobs}  "
                f"last heartbeat: {worker.last_heartbeat_at:%Y-%m-%d %H:%M:%S}"
            )
