from django.apps import AppConfig


class DbWorkerTasksConfig(AppConfig):
    name = "django_dbworker.tasks"
    label = "dbworker_tasks"
    verbose_name = "Tasks (django.tasks on the database worker)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
