from django.apps import AppConfig


class DbWorkerTasksConfig(AppConfig):
    name = "django_dbworker.tasks"
    label = "dbworker_tasks"
    verbose_name = "Tasks (django.tasks on the database worker)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ..signals import job_reset
        from . import checks  # noqa: F401 - registers the system checks
        from .models import TaskJob
        from .resets import task_failed_by_resetter

        job_reset.connect(task_failed_by_resetter, sender=TaskJob, dispatch_uid="dbworker-tasks")
