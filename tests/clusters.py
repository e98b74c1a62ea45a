"""A second PostgreSQL server of the suite's own (docs/operations.md § Several databases).

``SecondCluster`` runs ``initdb`` and ``pg_ctl`` (PostgreSQL's binaries: ``DBWORKER_TEST_PG_BIN``,
else ``pg_config --bindir``, else the newest ``/usr/lib/postgresql/*/bin``) on a free port,
with its files in a temporary directory. As root (CI) they run as ``postgres`` through
``runuser``: PostgreSQL refuses to run as root. Every wait is bounded. The directory
names the test process: a cluster a killed test run left behind is stopped and removed
by the next run (``clean_stale``), never one whose test process is alive.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PREFIX = "dbworker-second-"
#: Seconds any pg_ctl (start, stop) may take.
PG_CTL_WAIT = 30


def binaries() -> Path | None:
    """The directory of PostgreSQL's server binaries, or None."""
    candidates = []
    if os.environ.get("DBWORKER_TEST_PG_BIN"):
        candidates.append(os.environ["DBWORKER_TEST_PG_BIN"])
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
        candidates.append(found.stdout.strip())
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted(versions, key=lambda p: int(Path(p).parent.name), reverse=True)
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_owner() -> list[str]:
    """The prefix that runs a command as the cluster's owner: ``postgres`` under root."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale() -> None:
    """Stop and remove the clusters of test runs that are gone (killed before their
    teardown): each directory names its test process in ``owner``."""
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((root / "owner").read_text())
        except (OSError, ValueError):
            continue
        if _alive(owner):
            continue
        bin_dir = binaries()
        if bin_dir is not None and (root / "data" / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(
                    [*_as_owner(), str(bin_dir / "pg_ctl"), "-D", str(root / "data"), "stop"]
                    + ["-m", "immediate", "-w", "-t", str(PG_CTL_WAIT)],
                    capture_output=True,
                    timeout=PG_CTL_WAIT + 10,
                )
        shutil.rmtree(root, ignore_errors=True)


class SecondCluster:
    """A PostgreSQL cluster on 127.0.0.1:``port``, user ``postgres`` without a password."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.root / "owner").write_text(str(os.getpid()))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    def _run(self, *args: str, timeout: float = PG_CTL_WAIT + 10) -> None:
        done = subprocess.run(
            [*_as_owner(), *args], capture_output=True, text=True, timeout=timeout, cwd=self.root
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}"
                f"{self.server_log()}"
            )

    def server_log(self) -> str:
        try:
            return "\nserver log:\n" + self.log.read_text()[-3000:]
        except OSError:
            return ""

    def init(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "--encoding=UTF8",
            "--locale=C",
            timeout=120,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c max_connections=200 -c shared_buffers=64MB"
        )
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(PG_CTL_WAIT),
            "start",
        )

    def crash(self) -> None:
        """Stop the server as a crash does (``-m immediate``: every backend killed at
        once, no checkpoint; recovery replays the WAL at the next start)."""
        self.stop("immediate")

    def stop(self, mode: str = "fast") -> None:
        pg_ctl = str(self.bin_dir / "pg_ctl")
        self._run(pg_ctl, "-D", str(self.data), "stop", "-m", mode, "-w", "-t", str(PG_CTL_WAIT))

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, name: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def wait_ready(self, timeout: float = 30.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=3).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')

    def remove(self) -> None:
        """Stop the server (at once) and delete its files."""
        if self.running():
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
