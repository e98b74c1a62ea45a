import os

from django.apps import AppConfig


class BenchprojectConfig(AppConfig):
    name = "benchmarks.benchproject"
    label = "benchproject"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # BENCH_TASKS_RECEIVERS=none: Django's own receivers of the tasks signals
        # (its log records) disconnected, to measure what they cost (benchmarks.task_cost).
        if os.environ.get("BENCH_TASKS_RECEIVERS") == "none":
            from django.tasks import signals

            signals.task_enqueued.disconnect(signals.log_task_enqueued)
            signals.task_started.disconnect(signals.log_task_started)
            signals.task_finished.disconnect(signals.log_task_finished)
