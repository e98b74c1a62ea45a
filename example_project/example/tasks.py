"""Tasks of Django's tasks framework (``django.tasks``), run by the same workers.

``django_dbworker.tasks.task`` is Django's ``@task`` with the engine's options
(``max_retries``…) on every Django version: 6.1, 6.0 (whose ``@task`` takes none), and
5.2 with the ``django-tasks`` backport.
"""

from django_dbworker.tasks import task

from .models import Repository


@task(queue_name="emails", priority=10)
def send_digest(repository_id: int) -> str:
    """Pretend to mail a digest; its return value is kept as the task's result."""
    repository = Repository.objects.get(pk=repository_id)
    return f"digest of {repository.name} sent"


@task(max_retries=3, retry_after=0.5)
async def check_mirror(repository_id: int, attempt_fails: int = 0) -> dict:
    """An async task using the async ORM; the first ``attempt_fails`` attempts fail."""
    repository = await Repository.objects.aget(pk=repository_id)
    if attempt_fails and await _attempts(repository_id) < attempt_fails:
        raise ConnectionError(f"mirror of {repository.name} unreachable")
    return {"repository": repository.name, "mirror": f"{repository.url}.mirror"}


_tries: dict[int, int] = {}


async def _attempts(key: int) -> int:
    _tries[key] = _tries.get(key, 0) + 1
    return _tries[key] - 1
