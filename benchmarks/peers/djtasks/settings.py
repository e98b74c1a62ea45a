"""Settings for django-tasks-db (Django 6 ``django.tasks`` with its database backend).

``BENCH_DATABASE_URL`` picks the database; the harness sets it.
"""

import os
from urllib.parse import urlsplit

SECRET_KEY = "benchmark-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_tasks_db", "benchmarks.peers.djtasks"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_url = urlsplit(os.environ["BENCH_DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
