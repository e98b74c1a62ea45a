"""The benchmark's tasks of ``django.tasks``, run by django_dbworker's backend."""

from __future__ import annotations

import time

from django.tasks import task


@task()
def noop() -> None:
    return None


@task()
def sleep_1ms() -> None:
    time.sleep(0.001)
