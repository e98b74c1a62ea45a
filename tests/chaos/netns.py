"""Network namespaces for the ownership test: one per "host", each joined to the root
namespace by a veth pair on a private /30, and a TCP forwarder (``tcp_forward``) on
the root side of every pair relaying to PostgreSQL on loopback.

``lab(hosts)`` yields a ``Lab``; everything it made (namespaces, veths, the forwarder,
processes left in the namespaces) is removed on exit, also on failure. It skips the
test with the reason when namespaces cannot be made (not root, no ``ip``/``unshare``,
no permission in a container).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def unavailable() -> str | None:
    """Why namespaces cannot be used here (None: they can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


@dataclass
class Host:
    name: str
    namespace: str
    #: The forwarder's address on the root side of this host's veth pair.
    gateway: str
    #: The host's own address, in its namespace.
    address: str


class Lab:
    def __init__(self, count: int, port: int) -> None:
        tag = f"dwc{os.getpid() % 100000}"
        a, b = 200 + os.getpid() % 50, (os.getpid() // 50) % 250
        self.port = port
        self.hosts = [
            Host(
                f"dbw-host-{i}", f"{tag}n{i}", f"10.{a}.{b}.{4 * i + 1}", f"10.{a}.{b}.{4 * i + 2}"
            )
            for i in range(count)
        ]
        self._veths = [f"{tag}v{i}" for i in range(count)]
        self._made: list[str] = []
        self.forwarder: subprocess.Popen[str] | None = None

    def create(self) -> None:
        for host, veth in zip(self.hosts, self._veths, strict=True):
            inner = f"{veth}i"
            first = _ip("netns", "add", host.namespace, check=False)
            if first.returncode:
                pytest.skip(f"cannot create a network namespace: {first.stderr.strip()}")
            self._made.append(host.namespace)
            _ip("link", "add", veth, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", host.namespace)
            _ip("addr", "add", f"{host.gateway}/30", "dev", veth)
            _ip("link", "set", veth, "up")
            ns = ("netns", "exec", host.namespace, "ip")
            _ip(*ns, "addr", "add", f"{host.address}/30", "dev", inner)
            _ip(*ns, "link", "set", inner, "up")
            _ip(*ns, "link", "set", "lo", "up")
        listen = [f"{h.gateway}:{self.port}" for h in self.hosts]
        self.forwarder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.chaos.tcp_forward",
                *listen,
                "--to",
                f"127.0.0.1:{self.port}",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.forwarder.stdout is not None
        line = self.forwarder.stdout.readline()  # bounded: it prints or dies
        assert line.strip() == "ready", f"forwarder did not start: {line!r}"

    def command(self, host: Host, *argv: str) -> list[str]:
        """``argv`` run in ``host``'s namespace under its own hostname (one process:
        ``ip netns exec``, ``unshare`` and ``sh`` all exec, so the pid is ``argv``'s)."""
        script = 'hostname "$1" && shift && exec "$@"'
        return [
            "ip", "netns", "exec", host.namespace,
            "unshare", "--uts", "sh", "-c", script, "sh", host.name, *argv,
        ]  # fmt: skip

    def remove(self) -> None:
        if self.forwarder is not None and self.forwarder.poll() is None:
            self.forwarder.kill()
            self.forwarder.wait(10)
        if self.forwarder is not None and self.forwarder.stdout is not None:
            self.forwarder.stdout.close()
        for namespace in self._made:
            pids = _ip("netns", "pids", namespace, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "delete", namespace, check=False)  # removes the veth pair too
        for veth in self._veths:
            if Path(f"/sys/class/net/{veth}").exists():
                _ip("link", "delete", veth, check=False)


@contextlib.contextmanager
def lab(count: int, port: int = 5432):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    made = Lab(count, port)
    try:
        made.create()
        yield made
    finally:
        made.remove()
