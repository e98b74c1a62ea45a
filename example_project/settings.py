"""Settings of the example project, read from the environment (django-environ).

With no environment at all it runs on a SQLite file next to manage.py, so a
newcomer needs no server. ``DATABASE_URL=postgres://user@host:5432/name`` runs
the same project on PostgreSQL.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, True),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1"]),
)
environ.Env.read_env(BASE_DIR / ".env")  # optional; missing file is fine

DEBUG = env("DEBUG")
# Only for running the example locally: set SECRET_KEY in any real deployment.
SECRET_KEY = env("SECRET_KEY", default="example-project-insecure-key-not-for-production")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dbworker",
    "django_dbworker.tasks",  # django.tasks on the same engine (docs/tasks.md)
    "example_project.example",
]
try:  # Django 5.2: the django-tasks backport gives django.tasks' API
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "django_dbworker.tasks.DatabaseBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_RETRIES": 2, "RETRY_AFTER": 1, "WEIGHT": 50},
    }
}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "example_project.wsgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several worker processes write at once: WAL lets readers go on, the busy
    # timeout makes writers wait their turn instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    )

if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # MariaDB (docs/operations.md § Databases): sessions in UTC, as Django stores
    # datetimes; no partial indexes or constraints there (unique jobs are refused).
    DATABASES["default"].setdefault("OPTIONS", {})["init_command"] = "SET time_zone = '+00:00'"
    SILENCED_SYSTEM_CHECKS = ["models.W036", "models.W037"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

DBWORKER = {
    "HANDLERS": ["example_project.example.workers.ExampleHandler"],
    # One shared pool of 8 slots for every handler of a runworker process: the example
    # handler (weight 100, never more than its num_handlers = 4) and the tasks (weight
    # 50) share it (docs/flow-control.md § A shared pool).
    "POOL": 8,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"django_dbworker": {"handlers": ["console"], "level": "INFO"}},
}
