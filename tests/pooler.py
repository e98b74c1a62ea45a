"""PgBouncer for the tests: a process of our own, from a config written into a temporary
directory, never the system's service.

In a test, ``PgBouncer(mode).start()`` puts one in front of the test database's server
on a free port (``url(database)`` then reaches any database of that server through
it); ``restart()`` stops it and starts it again on the same port.

From the command line it runs pytest through one (what ``.ci/run`` does)::

    python -m tests.pooler run --mode transaction --port 6432 -- tests/test_worker.py

``run`` recreates the test database directly on the server (pytest-django would
create and drop it through the pooler, which keeps server connections to it), then
runs pytest with ``--reuse-db``, ``DATABASE_URL`` pointing at the pooler and
``DBWORKER_TEST_POOLER`` set to the mode (tests/settings.py), and drops the test
database afterwards. The server is ``$DATABASE_URL``'s (default
``postgres://postgres@127.0.0.1:5432/dbworker``), reached with trust auth.

Needs ``pgbouncer`` (Debian: ``apt-get install pgbouncer``). As root, it runs as the
``postgres`` user (PgBouncer refuses to run as root).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/dbworker"
#: Server connections per database and user of ``run``'s pooler, per mode.
TRANSACTION_POOL_SIZE = 20
SESSION_POOL_SIZE = 45


def available() -> str | None:
    """Why PgBouncer cannot run here (None: it can)."""
    if shutil.which("pgbouncer") is None:
        return "pgbouncer is not installed (apt-get install pgbouncer)"
    return None


def free_port(wanted: int | None = None) -> int:
    """``wanted`` if nothing listens on it on 127.0.0.1, else a free port."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", wanted or 0))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_port(url: str, port: int, database: str | None = None, host: str = "127.0.0.1") -> str:
    """``url`` with its host:port replaced by ``host``:``port`` (and its database)."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    path = f"/{database}" if database is not None else parts.path
    return urlunsplit((parts.scheme, netloc, path, parts.query, ""))


class PgBouncer:
    """One PgBouncer in ``mode`` ("transaction" or "session") in front of ``server``
    (host:port), on ``port`` (a free one by default)."""

    def __init__(
        self,
        mode: str,
        *,
        server: str = "127.0.0.1:5432",
        users: tuple[str, ...] = ("postgres",),
        port: int | None = None,
        pool_size: int = 20,
        directory: str | None = None,
    ) -> None:
        assert mode in ("transaction", "session"), mode
        self.mode = mode
        self.host, _, server_port = server.partition(":")
        self.server_port = int(server_port or 5432)
        self.users = users
        self.port = free_port(port)
        self.pool_size = pool_size
        self.dir = Path(directory or tempfile.mkdtemp(prefix=f"dbw-pgbouncer-{mode}-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "pgbouncer.log"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def config(self) -> Path:
        return self.dir / "pgbouncer.ini"

    def write_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "users.txt").write_text("".join(f'"{user}" ""\n' for user in self.users))
        # Every database of the server, by its own name (the test database too).
        self.config.write_text(
            "[databases]\n"
            f"* = host={self.host} port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            # The console (``admin()``): PAUSE, KILL, RESUME.
            f"admin_users = {self.users[0]}\n"
            f"pool_mode = {self.mode}\n"
            "max_client_conn = 2000\n"
            f"default_pool_size = {self.pool_size}\n"
            "server_login_retry = 1\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
            # Clients wait at most this long for a server connection (a test fails
            # instead of hanging when the pool is too small).
            "query_wait_timeout = 60\n"
        )
        self.dir.chmod(0o755)
        for path in (self.config, self.dir / "users.txt"):
            path.chmod(0o644)

    def start(self, timeout: float = 15.0) -> PgBouncer:
        reason = available()
        if reason:
            raise RuntimeError(reason)
        self.write_config()
        command = ["pgbouncer", str(self.config)]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            command[1:1] = ["-u", _unprivileged_user()]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}):\n{self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(self.address, 1):
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pgbouncer did not listen on {self.port}:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGTERM: at once, every client and server connection cut)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self, down: float = 0.0) -> None:
        """Stop it and start it again on the same port after ``down`` seconds."""
        self.stop()
        time.sleep(down)
        self.start()

    def admin(self, command: str) -> str:
        """Run ``command`` on the pooler's console (``KILL db``: every client and server
        connection of ``db`` cut, and new ones wait until ``RESUME``); its output."""
        done = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.users[0], "-d"]
            + ["pgbouncer", "-X", "-A", "-t", "-c", command],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"pgbouncer console: {command}: {done.stderr.strip()}")
        return done.stdout

    def url(self, base: str, database: str | None = None) -> str:
        """``base`` (a postgres:// URL) through this pooler."""
        return with_port(base, self.port, database)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _unprivileged_user() -> str:
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("no user to run pgbouncer as (it refuses root)")


# -- the command line ---------------------------------------------------------------------


def _admin(url: str, *statements: str) -> None:
    import psycopg

    parts = urlsplit(url)
    maintenance = urlunsplit((parts.scheme, parts.netloc, "/postgres", "", ""))
    with psycopg.connect(maintenance, autocommit=True, connect_timeout=10) as conn:
        for statement in statements:
            conn.execute(statement)


def run(mode: str, port: int | None, pytest_args: list[str]) -> int:
    """pytest through a PgBouncer in ``mode`` in front of ``$DATABASE_URL``'s server."""
    server = os.environ.get("DATABASE_URL") or DEFAULT_SERVER
    parts = urlsplit(server)
    name = parts.path.lstrip("/") or "dbworker"
    test_name = f"test_{name}"
    user = parts.username or "postgres"
    address = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
    # Session mode gives each client a server connection for as long as it is connected:
    # the pool must hold every client at once (the chaos suite's fleet and its resetter).
    size = SESSION_POOL_SIZE if mode == "session" else TRANSACTION_POOL_SIZE
    bouncer = PgBouncer(mode, server=address, users=(user,), port=port, pool_size=size)
    quoted = '"' + test_name.replace('"', '""') + '"'
    _admin(server, f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)", f"CREATE DATABASE {quoted}")
    bouncer.start()
    print(f"=== pgbouncer ({mode} mode) on port {bouncer.port}, log {bouncer.log_path}", flush=True)
    env = {
        **os.environ,
        "DATABASE_URL": bouncer.url(server),
        "DBWORKER_TEST_POOLER": mode,
        # Tests that need the server itself (wake-ups through a direct connection).
        "DBWORKER_TEST_SERVER_URL": server,
    }
    if mode == "session":  # wake-ups through the pooler itself, as its users set it
        env["DBWORKER_TEST_LISTEN_POOLED"] = "1"
    try:
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "--reuse-db", "-p", "no:cacheprovider", *pytest_args],
            cwd=ROOT,
            env=env,
        )
    finally:
        bouncer.stop()
        with contextlib.suppress(Exception):
            _admin(server, f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
    if code:
        print(f"=== pgbouncer log (last lines):\n{bouncer.log()}", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.pooler", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run", help="run pytest through a PgBouncer")
    runner.add_argument("--mode", choices=("transaction", "session"), required=True)
    runner.add_argument("--port", type=int, help="port to listen on (default: a free one)")
    runner.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args(argv)
    return run(args.mode, args.port, args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())
