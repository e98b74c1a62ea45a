"""Throw-away Django projects in a temporary directory, run as subprocesses: what a
user's project looks like to ``check``, ``makemigrations``, ``migrate`` and
``runworker`` (a model of their own, migrations, an older django_dbworker)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.pace import scaled

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = """
import os
import environ

SECRET_KEY = "tests-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = {apps!r}
DATABASES = {{"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}}
DBWORKER = {dbworker!r}
LOGGING = {{
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {{"django_dbworker": {{"level": "INFO"}}}},
}}
"""


class Project:
    """A project in ``root``: ``projsettings`` and the apps written with ``app()``;
    commands run with ``package`` (a directory holding ``django_dbworker``, default this
    checkout's) first on the import path."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.root = root
        self.database_url = database_url
        self.apps: list[str] = []
        self.dbworker: dict[str, object] = {"RESET_INTERVAL": 0.5}
        self.core_apps = ["django.contrib.contenttypes", "django.contrib.auth", "django_dbworker"]
        #: Appended to the settings module.
        self.extra_settings = ""
        self.procs: list[subprocess.Popen[str]] = []

    def app(self, name: str, **modules: str) -> Path:
        """Write app ``name`` (an empty migrations package, and ``modules``: its
        ``models``, ``handlers``…) and add it to INSTALLED_APPS."""
        path = self.root / name
        (path / "migrations").mkdir(parents=True, exist_ok=True)
        (path / "__init__.py").touch()
        (path / "migrations" / "__init__.py").touch()
        for module, source in modules.items():
            (path / f"{module}.py").write_text(textwrap.dedent(source))
        if name not in self.apps:
            self.apps.append(name)
        self.write_settings()
        return path

    def write_settings(self) -> None:
        apps = [*self.core_apps, *self.apps]
        settings = SETTINGS.format(apps=apps, dbworker=self.dbworker)
        (self.root / "projsettings.py").write_text(f"{settings}\n{self.extra_settings}\n")

    def env(self, package: Path | None = None) -> dict[str, str]:
        path = [str(package or ROOT), str(self.root)]
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "projsettings",
            "DATABASE_URL": self.database_url,
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONUNBUFFERED": "1",
        }

    def run(
        self, *args: str, package: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``python -m django <args>``, to its end."""
        return subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=self.root,
            env=self.env(package),
            capture_output=True,
            text=True,
            timeout=scaled(timeout),
            stdin=subprocess.DEVNULL,
        )

    def start(self, *args: str, package: Path | None = None, log: str = "") -> Popen:
        """``python -m django <args>`` in the background, its output in ``log``."""
        path = self.root / (log or f"proc-{len(self.procs)}.log")
        with path.open("w") as out:  # the child writes to its own copy of the descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "django", *args],
                cwd=self.root,
                env=self.env(package),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        self.procs.append(proc)
        return Popen(proc, path)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)


class Popen:
    """A started command and the file its output goes to."""

    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        self.proc = proc
        self.log = log

    @property
    def output(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float = 60.0) -> int:
        timeout = scaled(timeout)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"{self.proc.args} did not exit in {timeout}s; output:\n{self.output}")


def old_package(tmp_path: Path, commit: str) -> Path:
    """django_dbworker as it was at ``commit`` (an older release), in a directory of its
    own: ``Project.run(..., package=...)`` runs it."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode:
        pytest.fail(f"commit {commit} is not in this clone (a shallow clone?)")
    target = tmp_path / f"old-{commit}"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "django_dbworker"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def fresh_database_url(vendor: str, root: Path, base_url: str) -> tuple[str, object]:
    """A new empty database of ``vendor`` (a SQLite file in ``root``, or a PostgreSQL
    database on the server of ``base_url``), and a callable that drops it."""
    if vendor == "sqlite":
        return f"sqlite:///{root / 'project.sqlite3'}", lambda: None
    if vendor == "mysql":
        return _fresh_mariadb_database(base_url)
    import psycopg

    name = f"dbw_project_{uuid.uuid4().hex[:12]}"
    server = base_url.rsplit("/", 1)[0]
    dsn = server.replace("postgres://", "postgresql://", 1) + "/postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        # Dropped at the end of the session: DROP DATABASE waits for a checkpoint, which
        # under the chaos tests' writes (run beside it) took up to 50 s per database.
        UNDROPPED.append((dsn, name))

    return f"{server}/{name}", drop


#: (maintenance DSN, name) of the project databases left to drop.
UNDROPPED: list[tuple[str, str]] = []


def drop_databases() -> None:
    """Drop the project databases of this session (pytest_sessionfinish)."""
    import psycopg

    while UNDROPPED:
        dsn, name = UNDROPPED.pop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fresh_mariadb_database(base_url: str) -> tuple[str, object]:
    import MySQLdb
    from django.db import connection

    settings = connection.settings_dict
    name = f"dbw_project_{uuid.uuid4().hex[:12]}"

    def run(sql: str) -> None:
        conn = MySQLdb.connect(
            host=settings["HOST"] or "127.0.0.1",
            port=int(settings["PORT"] or 3306),
            user=settings["USER"] or "root",
            password=settings["PASSWORD"] or "",
        )
        try:
            conn.cursor().execute(sql)
        finally:
            conn.close()

    run(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    return f"{base_url.rsplit('/', 1)[0]}/{name}", lambda: run(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def project(tmp_path):
    """A throw-away project on a new database of the suite's vendor."""
    from django.db import connection

    from .conftest import test_database_url

    url, drop = fresh_database_url(connection.vendor, tmp_path, test_database_url())
    proj = Project(tmp_path, url)
    proj.write_settings()
    try:
        yield proj
    finally:
        proj.stop_all()
        drop()  # type: ignore[operator]
