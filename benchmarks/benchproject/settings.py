"""Settings of the benchmark project.

``BENCH_DATABASE_URL`` (``postgres://user@host:port/name``) picks the database;
the harness sets it. Nothing here is meant for production.
"""

import os
from urllib.parse import urlsplit

SECRET_KEY = "benchmark-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_dbworker",
    "django_dbworker.tasks",
    "benchmarks.benchproject",
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_url = urlsplit(
    os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/dbworker_bench")
)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends."
        + ("mysql" if _url.scheme.startswith("mysql") else "postgresql"),
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}

DBWORKER = {"HANDLERS": ["benchmarks.benchproject.handlers.NoopHandler"]}

# Two servers (benchmarks/multidb.py): OtherBenchJob on the second one.
if os.environ.get("BENCH_SECOND_URL"):
    _second = urlsplit(os.environ["BENCH_SECOND_URL"])
    DATABASES["second"] = {
        **DATABASES["default"],
        "NAME": _second.path.lstrip("/"),
        "HOST": _second.hostname or "",
        "PORT": str(_second.port or ""),
    }
    DATABASE_ROUTERS = ["benchmarks.benchproject.routers.SecondRouter"]

# Through PgBouncer (the harness's django_dbworker-pgbouncer-* systems): transaction
# mode needs Django's server-side cursors off, and LISTENs through a direct alias;
# session mode LISTENs through the pooler itself (docs/operations.md).
if os.environ.get("BENCH_POOLER") == "transaction":
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if os.environ.get("BENCH_POOLER") == "session":
    DBWORKER["LISTEN_DATABASE"] = "default"
if os.environ.get("BENCH_LISTEN_URL"):
    _direct = urlsplit(os.environ["BENCH_LISTEN_URL"])
    DATABASES["direct"] = {
        **DATABASES["default"],
        "HOST": _direct.hostname or "",
        "PORT": str(_direct.port or ""),
        "DISABLE_SERVER_SIDE_CURSORS": False,
    }
    DBWORKER["LISTEN_DATABASE"] = "direct"

# The tasks variant (system "django_dbworker-tasks"): django.tasks on this engine.
TASKS = {
    "default": {
        "BACKEND": "django_dbworker.tasks.DatabaseBackend",
        "QUEUES": ["default"],
        # Finished results are kept (the harness empties the table between runs).
        "OPTIONS": {"RESULT_RETENTION": None},
    }
}

# Django logs two INFO records per task (django.tasks: started, finished); with its
# default logging they are built and then dropped, at a cost a no-op task feels.
# BENCH_TASKS_LOG_LEVEL=WARNING measures the tasks without them (docs/benchmarks.md).
if os.environ.get("BENCH_TASKS_LOG_LEVEL"):
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {"django.tasks": {"level": os.environ["BENCH_TASKS_LOG_LEVEL"]}},
    }
