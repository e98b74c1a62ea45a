"""Django's tasks framework: ``django.tasks`` (Django 6), or the ``django-tasks``
backport (``django_tasks``) on Django 5.2, under one set of names. ``AVAILABLE`` is
false when neither is installed (the system check ``dbworker.E101`` says what to do).
"""

from __future__ import annotations

from typing import Any

tasks: Any
base: Any
backends_base: Any
exceptions: Any
signals: Any
normalize_json: Any

try:  # Django >= 6.0
    import django.tasks as tasks
    import django.tasks.backends.base as backends_base
    import django.tasks.base as base
    import django.tasks.exceptions as exceptions
    import django.tasks.signals as signals
    from django.utils.json import normalize_json
except ImportError:  # pragma: no cover - Django 5.2
    try:
        import django_tasks as tasks  # type: ignore[import-not-found,no-redef,unused-ignore]
        import django_tasks.backends.base as backends_base  # type: ignore[import-not-found,no-redef,unused-ignore]
        import django_tasks.base as base  # type: ignore[import-not-found,no-redef,unused-ignore]
        import django_tasks.exceptions as exceptions  # type: ignore[import-not-found,no-redef,unused-ignore]
        import django_tasks.signals as signals  # type: ignore[import-not-found,no-redef,unused-ignore]
        from django_tasks.utils import normalize_json  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:
        tasks = base = backends_base = exceptions = signals = normalize_json = None

AVAILABLE = tasks is not None

if AVAILABLE:
    Task = base.Task
    DEFAULT_TASK_PRIORITY = base.DEFAULT_TASK_PRIORITY
    DEFAULT_TASK_QUEUE_NAME = base.DEFAULT_TASK_QUEUE_NAME
    DEFAULT_TASK_BACKEND_ALIAS = base.DEFAULT_TASK_BACKEND_ALIAS
    TaskContext = base.TaskContext
    TaskError = base.TaskError
    TaskResult = base.TaskResult
    TaskResultStatus = base.TaskResultStatus
    BaseTaskBackend = backends_base.BaseTaskBackend
    # The backport names two exceptions differently.
    InvalidTask = getattr(exceptions, "InvalidTask", None) or exceptions.InvalidTaskError
    TaskResultDoesNotExist = exceptions.TaskResultDoesNotExist
    TaskResultMismatch = exceptions.TaskResultMismatch


def require() -> Any:
    """The tasks module, or a clear error."""
    if tasks is None:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "django_dbworker.tasks needs Django's tasks framework: Django >= 6.0, or "
            "`pip install django-tasks` on Django 5.2"
        )
    return tasks
