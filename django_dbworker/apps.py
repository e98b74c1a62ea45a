from django.apps import AppConfig


class DbWorkerConfig(AppConfig):
    name = "django_dbworker"
    verbose_name = "Database worker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
