"""Settings for the test suite. ``DATABASE_URL`` picks the database (default: SQLite).

The suite runs the same on SQLite and PostgreSQL. Subprocess tests start
``runworker`` with ``DATABASE_URL`` pointing at the test database.
"""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent
SQLITE_PATH = os.environ.get("DBWORKER_TEST_SQLITE", str(BASE_DIR / ".db" / "dbworker.sqlite3"))

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dbworker",
    "django_dbworker.tasks",
    "tests.testapp",
]
try:  # Django 5.2: the django-tasks backport (Django 6 has django.tasks built in)
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "django_dbworker.tasks.DatabaseBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2, "STALLED_MAX_AGE": 2.0},
    }
}
# The kill loops of the chaos tests reset a task now and then whose worker they kill
# again and again on a slow host: their workers get a reset budget that no chance can
# spend (as ChaosHandler's), so a task failed by it is a finding, not bad luck.
if os.environ.get("DBWORKER_TEST_TASK_RESETS"):
    TASKS["default"]["OPTIONS"]["MAX_NUM_RESETS"] = int(os.environ["DBWORKER_TEST_TASK_RESETS"])

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": environ.Env.db_url_config(os.environ.get("DATABASE_URL", f"sqlite:///{SQLITE_PATH}"))
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file, not :memory:, so other connections and worker subprocesses see it.
    DATABASES["default"]["TEST"] = {"NAME": SQLITE_PATH.replace(".sqlite3", "-test.sqlite3")}

if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # MariaDB (docs/operations.md § Databases): sessions in UTC, as Django stores
    # datetimes; no partial indexes or constraints there (unique jobs are refused).
    DATABASES["default"].setdefault("OPTIONS", {})["init_command"] = "SET time_zone = '+00:00'"
    SILENCED_SYSTEM_CHECKS = ["models.W036", "models.W037"]
    # DBWORKER_TEST_MARIADB_COLLATION=utf8mb4_unicode_ci (.ci/run): the test databases
    # are created in that collation and the connections speak its character set, as
    # Django's docs advise (OPTIONS["charset"] = "utf8mb4"). Unset: the server's
    # default collation and Django's default character set (utf8, i.e. utf8mb3).
    if os.environ.get("DBWORKER_TEST_MARIADB_COLLATION"):
        _collation = os.environ["DBWORKER_TEST_MARIADB_COLLATION"]
        _charset = _collation.split("_")[0]
        DATABASES["default"]["OPTIONS"]["charset"] = _charset
        DATABASES["default"]["TEST"] = {"CHARSET": _charset, "COLLATION": _collation}

if os.environ.get("DBWORKER_TEST_POOL") and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # Django's connection pool, small: a worker must not keep its connections.
    DATABASES["default"]["OPTIONS"] = {"pool": {"min_size": 1, "max_size": 3, "timeout": 5}}
    DATABASES["default"]["CONN_MAX_AGE"] = 0

# Through PgBouncer (``python -m tests.pooler run``): the suite with the library's
# defaults. Django's server-side cursors (``.iterator()``) do not survive transaction
# pooling (Django's docs: DISABLE_SERVER_SIDE_CURSORS).
POOLER = os.environ.get("DBWORKER_TEST_POOLER")
if POOLER == "transaction":
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True


# Two databases (tests/clusters.py starts the second server; docs/operations.md § Several
# databases): the models tests/routers.py names live on the alias "second". Worker
# subprocesses get the URL; the test process adds the alias itself (tests/conftest.py).
if os.environ.get("DBWORKER_TEST_SECOND_URL"):
    DATABASES["second"] = environ.Env.db_url_config(os.environ["DBWORKER_TEST_SECOND_URL"])
    DATABASE_ROUTERS = ["tests.routers.SecondRouter"]

# The test handlers' records of their attempts (Event rows, tests/testapp/handlers.py)
# over a connection of their own: a chaos test whose workers reach the database
# through a pooler it stalls gives them one straight to the server, so what its audit
# sees is the workers' doing, not a handler's own statement waiting in the pooler.
if os.environ.get("DBWORKER_TEST_EVENTS_URL"):
    DATABASES["events"] = environ.Env.db_url_config(os.environ["DBWORKER_TEST_EVENTS_URL"])

DBWORKER = {"RESET_INTERVAL": 0.5}
# A worker subprocess that LISTENs through a direct connection (tests of
# DBWORKER["LISTEN_DATABASE"]): the test database on the server itself.
if os.environ.get("DBWORKER_TEST_LISTEN_URL"):
    DATABASES["direct"] = environ.Env.db_url_config(os.environ["DBWORKER_TEST_LISTEN_URL"])
    DBWORKER["LISTEN_DATABASE"] = "direct"
# A pooler in session mode, the user's word for it (LISTEN through the pooled alias).
if os.environ.get("DBWORKER_TEST_LISTEN_POOLED"):
    DBWORKER["LISTEN_DATABASE"] = "default"
# The consumer ownership chaos test shortens the lease and the rebalancing interval.
for _name in ("CONSUMER_LEASE", "CONSUMER_REBALANCE_INTERVAL"):
    if os.environ.get(f"DBWORKER_TEST_{_name}"):
        DBWORKER[_name] = float(os.environ[f"DBWORKER_TEST_{_name}"])

# INFO records reach pytest's caplog; subprocess workers log to stderr (runworker -v1).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"django_dbworker": {"level": "INFO"}},
}
