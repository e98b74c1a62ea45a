"""Many hosts through one pooler: ``runworker`` processes on 4 "hosts" (network namespaces,
each under its own hostname, as the consumers' ownership test makes them) reach the
database through one PgBouncer in transaction mode (tests/pooler.py), with the
library's defaults. While they drain jobs under fleet-wide limits, a host is killed
(kill -9 of its worker) and comes back, and the pooler is restarted (every client and
server connection cut). Then: lost 0, overlapping attempts 0, the limits kept and used,
each key in order; the resetter reset only jobs of the killed host.

PostgreSQL only; skipped where network namespaces cannot be made (not root, no ``ip``)
or ``pgbouncer`` is not installed. Sizes: CI 4 hosts, 800 jobs, one kill and one pooler
restart (< 90 s); full (DBWORKER_CHAOS_FULL=1) 4,000 jobs, a kill every 5-10 s and a
pooler restart every 20 s.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.chaos.conftest import (
    POSTGRES_ONLY,
    audit,
    limit_audit,
    say,
    scale,
    tenant_jobs,
    unfinished,
    within,
)
from tests.chaos.netns import Host, Lab, lab
from tests.conftest import server_url
from tests.conftest import test_database_url as database_url
from tests.pooler import PgBouncer, available, with_port
from tests.testapp.models import TenantJob

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
    *POSTGRES_ONLY,
    pytest.mark.skipif(bool(available()), reason=available() or ""),
    pytest.mark.timeout(scale(180, 1800)),
]

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "tests.testapp.handlers.LimitedChaosHandler"  # 5 at once, 1 per tenant
MAX_CONCURRENCY, PER_KEY = 5, 1
HOSTS = 4
KEYS = 50
JOBS = scale(800, 4_000)
HANDLERS = 4
#: Seconds between kills and between pooler restarts (full size; CI does one of each).
KILL_EVERY = (5.0, 10.0)
RESTART_EVERY = 20.0


@dataclass
class Worker:
    host: Host
    proc: subprocess.Popen[bytes]
    log: Path


class Hosts:
    """At most one runworker per host, all through the pooler's port on the host's
    gateway (the lab's forwarder relays it to the pooler on loopback)."""

    def __init__(self, made: Lab, tmp: Path, url: str) -> None:
        self.lab = made
        self.tmp = tmp
        self.url = url
        self.workers: list[Worker] = []
        #: pid -> time.time() once killed.
        self.died_at: dict[int, float] = {}
        #: Jobs the killed workers held when they died (each must be reset).
        self.cut = 0

    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def start(self, host: Host) -> Worker:
        log = self.tmp / f"{host.name}-{len(self.workers)}.log"
        url = self.url.replace("127.0.0.1", host.gateway)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": url,
            "DBWORKER_TEST_POOLER": "transaction",
        }
        argv = ["-m", "django", "runworker", HANDLER, "--no-resetter"]
        with open(log, "w") as out:
            proc = subprocess.Popen(
                self.lab.command(host, sys.executable, *argv, "--num-handlers", str(HANDLERS)),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        worker = Worker(host, proc, log)
        self.workers.append(worker)
        say(f"start {host.name} (pid {proc.pid})")
        return worker

    def holding(self) -> Worker | None:
        """A running worker that holds a running job (its kill cuts an attempt)."""
        pids = set(holding_pids())
        mine = [w for w in self.running() if w.proc.pid in pids]
        return random.choice(mine) if mine else None

    def kill(self, worker: Worker) -> None:
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(10)
        self.died_at[worker.proc.pid] = time.time()
        # Chosen as a holder, it may have finished its job before the signal landed.
        cut = holding_pids().count(worker.proc.pid)
        self.cut += cut
        say(f"kill -9 {worker.host.name} (pid {worker.proc.pid}), holding {cut} jobs")

    def check_alive(self) -> None:
        for w in self.workers:
            if w.proc.pid not in self.died_at and w.proc.poll() is not None:
                pytest.fail(f"{w.host.name} exited by itself:\n{w.log.read_text()[-3000:]}")

    def stop(self, timeout: float = 60) -> list[int | None]:
        for w in self.running():
            w.proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for w in self.workers:
            if w.proc.pid in self.died_at:
                continue
            try:
                codes.append(w.proc.wait(timeout))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(10)
                codes.append(None)
        return codes

    def output(self) -> str:
        return "\n".join(w.log.read_text(errors="replace") for w in self.workers)


def test_hosts_through_a_transaction_pooler_lose_nothing_and_keep_the_limits(spawn, tmp_path):
    rng = random.Random(30)
    tenant_jobs(JOBS, KEYS, rng)
    server = urlsplit(server_url())
    bouncer = PgBouncer("transaction", server=f"{server.hostname}:{server.port or 5432}").start()
    pooled = with_port(database_url(), bouncer.port)
    resetter = None
    restarts = 0
    started = time.monotonic()
    try:
        with lab(HOSTS, port=bouncer.port) as made:
            hosts = Hosts(made, tmp_path, pooled)
            try:
                resetter = spawn(
                    "runresetter",
                    HANDLER,
                    "--interval",
                    "0.5",
                    env={"DATABASE_URL": pooled, "DBWORKER_TEST_POOLER": "transaction"},
                )
                for host in made.hosts:
                    hosts.start(host)
                deadline = started + within(150, 1700)
                killed: Worker | None = None
                next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
                next_restart = time.monotonic() + RESTART_EVERY
                while (left := unfinished(TenantJob)) > 0:
                    if time.monotonic() > deadline:
                        pytest.fail(f"{left} jobs left unfinished:\n{hosts.output()[-3000:]}")
                    hosts.check_alive()
                    done = 1 - left / JOBS
                    due = scale(killed is None and done > 0.2, time.monotonic() > next_kill)
                    if due and (victim := hosts.holding()) is not None:
                        killed = victim
                        hosts.kill(killed)
                        next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
                    elif (
                        killed is not None
                        and killed.host.name not in running_hosts(hosts)
                        and scale(done > 0.6, True)
                    ):
                        hosts.start(killed.host)  # the host comes back
                    if scale(restarts == 0 and done > 0.4, time.monotonic() > next_restart):
                        say(f"restart the pooler, {left} jobs left")
                        bouncer.restart(down=0.5)
                        restarts += 1
                        next_restart = time.monotonic() + RESTART_EVERY
                    time.sleep(0.1)
                duration = time.monotonic() - started
                codes = hosts.stop()
                assert set(codes) == {0}, hosts.output()[-5000:]
                resetter.signal(signal.SIGTERM)
                assert resetter.wait(30) == 0, resetter.output
            finally:
                for w in hosts.running():
                    w.proc.kill()
                    w.proc.wait(10)
    finally:
        bouncer.stop()

    report = audit(hosts.died_at, resetter.output + hosts.output(), model=TenantJob)
    overall, worst_key, out_of_order = limit_audit(hosts.died_at)
    say(
        f"{HOSTS} hosts through PgBouncer (transaction mode): {len(hosts.died_at)} kills, "
        f"{restarts} pooler restarts, {report.summary()}, peak overlap {overall} (limit "
        f"{MAX_CONCURRENCY}), per key {worst_key} (limit {PER_KEY}), out of order "
        f"{out_of_order}, {JOBS / duration:.0f} jobs/s in {duration:.0f}s; {report.problems}"
    )
    assert "prepared statement" not in hosts.output()
    assert report.problems == [], resetter.output[-4000:] + hosts.output()[-6000:]
    assert report.jobs == JOBS
    assert (report.lost, report.overlaps) == (0, 0)
    assert overall <= MAX_CONCURRENCY
    assert worst_key <= PER_KEY
    assert out_of_order == 0
    assert overall == MAX_CONCURRENCY  # the limit was used, not only kept
    assert len(hosts.died_at) >= 1
    # Every job a kill cut was reset. Which jobs it cut is the moment's: the worker chosen
    # for holding one can finish it before the signal lands (CI: 0 held, 0 resets).
    assert report.resets >= hosts.cut
    assert restarts >= 1
    hostnames = {w.host.name for w in hosts.workers}
    assert len(hostnames) == HOSTS


def holding_pids() -> list[int]:
    """The worker process of each processing job (worker ids are ``host:pid:…``)."""
    held = TenantJob.objects.filter(state="processing").values_list("worker_hostname", flat=True)
    return [int(worker_id.split(":")[1]) for worker_id in held if worker_id]


def running_hosts(hosts: Hosts) -> set[str]:
    return {w.host.name for w in hosts.running()}
