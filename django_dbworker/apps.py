from typing import Any

from django.apps import AppConfig


class DbWorkerConfig(AppConfig):
    name = "django_dbworker"
    verbose_name = "Database worker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from . import checks, databases, support  # noqa: F401 - registers the system checks

        post_migrate.connect(_sync_tables, sender=self, dispatch_uid="dbworker_triggers")


def _sync_tables(using: str = "default", **kwargs: Any) -> None:
    """``migrate``: the wake-up triggers and the fillfactor of every job table
    (``sql.triggers``, ``sql.tables``)."""
    from .models import job_models
    from .sql.tables import sync_fillfactor
    from .sql.triggers import sync_triggers

    models = job_models()
    sync_triggers(models, using)
    sync_fillfactor(models, using)
