from typing import Any

from django.apps import AppConfig


class DbWorkerConfig(AppConfig):
    name = "django_dbworker"
    verbose_name = "Database worker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from . import checks, support  # noqa: F401 - registers the system checks

        post_migrate.connect(_sync_triggers, sender=self, dispatch_uid="dbworker_triggers")


def _sync_triggers(using: str = "default", **kwargs: Any) -> None:
    """``migrate``: the wake-up triggers of every job table (``sql.triggers``)."""
    from .models import job_models
    from .sql.triggers import sync_triggers

    sync_triggers(job_models(), using)
