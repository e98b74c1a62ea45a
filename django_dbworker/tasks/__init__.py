"""Django's tasks framework (``django.tasks``) on the worker engine: a separate app.

``INSTALLED_APPS = [..., "django_dbworker", "django_dbworker.tasks"]`` and
``TASKS = {"default": {"BACKEND": "django_dbworker.tasks.DatabaseBackend"}}``;
``runworker --tasks`` runs them. ``task`` is ``@task`` with the engine's options
(``max_retries``…) on every Django version. See docs/tasks.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DatabaseBackend", "DatabaseTask", "task"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the backend needs the tasks framework (Django >= 6, or
    # django-tasks), which the app's system check reports on when it is missing.
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(name)
