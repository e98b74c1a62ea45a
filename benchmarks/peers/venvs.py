"""Virtual environments of the peers, created and filled from PyPI by the harness.

Each peer gets ``.benchmarks-venvs/<peer>`` (git-ignored) on Python 3.12 with
exact pins, so a run says what it measured. A venv whose pins changed is rebuilt.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".benchmarks-venvs"

#: What each peer's venv holds (the peer, its documented driver, nothing else).
PINS: dict[str, list[str]] = {
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg==0.32.0"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]==3.3.9"],
    "django-tasks-db": ["django-tasks-db==0.13.0", "Django==6.1.3", "psycopg[binary]==3.3.9"],
}


def find_python() -> str:
    """A Python 3.12 (Django 6 needs ≥ 3.12): ``BENCH_PEER_PYTHON``, pyenv's, PATH, or ours."""
    candidates = [
        os.environ.get("BENCH_PEER_PYTHON"),
        str(Path.home() / ".pyenv/versions/3.12.1/bin/python"),
        shutil.which("python3.12"),
        sys.executable if sys.version_info >= (3, 12) else None,
    ]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("no Python 3.12 found for the peers' venvs; set BENCH_PEER_PYTHON")


def python_of(peer: str) -> str:
    return str(VENVS / peer / "bin" / "python")


def ensure(peer: str, log: object = None) -> str:
    """Create or refresh the venv of ``peer``; return its interpreter."""
    venv = VENVS / peer
    marker = venv / ".bench-pins"
    wanted = "\n".join(PINS[peer])
    if marker.exists() and marker.read_text() == wanted and Path(python_of(peer)).exists():
        return python_of(peer)
    print(f"[peers] installing {peer} into {venv} ({', '.join(PINS[peer])})", file=sys.stderr)
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([find_python(), "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [python_of(peer), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        + PINS[peer],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    marker.write_text(wanted)
    return python_of(peer)


def versions(peer: str) -> dict[str, str]:
    """The installed distributions of a peer's venv (``pip freeze``)."""
    out = subprocess.run(
        [python_of(peer), "-m", "pip", "freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pairs = (line.split("==", 1) for line in out.splitlines() if "==" in line)
    return dict(pairs)
