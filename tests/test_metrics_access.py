"""Who may read the metrics, and what scrapes cost (issue 42, item 5): ``metrics_view``
needs the ``django_dbworker.view_metrics`` permission (not just staff), and the
``runworker --metrics-port`` server reads the database for one scrape at a time (one
connection), however many scrapes arrive at once."""

import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client

from tests.conftest import wait_until
from tests.test_metrics import TOKEN, free_port, serving

HANDLER = "tests.testapp.handlers.BehaviorHandler"
#: Scrapes sent at once, and how many times.
SCRAPES, ROUNDS = 40, 3


# -- the permission --------------------------------------------------------------------


@pytest.mark.django_db
def test_the_view_needs_the_view_metrics_permission(django_user_model, settings):
    """Any active staff user read every model's gauges."""
    settings.ROOT_URLCONF = "tests.test_metrics"
    staff = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    refused = client.get("/metrics")
    assert refused.status_code == 403
    assert b"django_dbworker.view_metrics" in refused.content
    staff.user_permissions.add(Permission.objects.get(codename="view_metrics"))
    staff = django_user_model.objects.get(pk=staff.pk)  # no cached permissions
    client.force_login(staff)
    served = client.get("/metrics")
    assert served.status_code == 200
    assert b"dbworker_jobs{" in served.content
    # Not staff, but given the permission: a monitoring account.
    reader = django_user_model.objects.create_user("reader", password="pw")
    reader.user_permissions.add(Permission.objects.get(codename="view_metrics"))
    client.force_login(reader)
    assert client.get("/metrics").status_code == 200
    reader.is_active = False
    reader.save()
    assert Client().get("/metrics").status_code == 403
    # A superuser has it; a scraper's token still serves.
    admin = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    assert client.get("/metrics").status_code == 200
    settings.DBWORKER = {**settings.DBWORKER, "METRICS_TOKEN": TOKEN}
    scraper = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert scraper.status_code == 200


# -- one collection at a time ------------------------------------------------------------


class SlowCollector:
    """Counts its collections, and how many run at once."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.calls = 0
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def collect(self):
        with self.lock:
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return []


def collect_at_once(collector, count):
    threads = [threading.Thread(target=lambda: list(collector.collect())) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)


def test_scrapes_at_once_share_one_collection():
    from django_dbworker.contrib.prometheus_gauges import OneAtATime

    slow = SlowCollector(0.2)
    shared = OneAtATime(slow, reuse_for=5.0)
    collect_at_once(shared, 30)
    assert (slow.calls, slow.most) == (1, 1)
    # Past reuse_for, the next scrape reads again.
    fresh = OneAtATime(slow, reuse_for=0.0)
    collect_at_once(fresh, 10)
    assert slow.most == 1
    assert slow.calls == 11


def test_a_scrape_that_waits_too_long_gets_the_last_figures():
    from django_dbworker.contrib.prometheus_gauges import OneAtATime

    slow = SlowCollector(1.0)
    shared = OneAtATime(slow, reuse_for=0.0, wait=0.1)
    started = threading.Thread(target=lambda: list(shared.collect()))
    started.start()
    wait_until(lambda: slow.running, 5, 0.01, "the first collection")
    began = time.monotonic()
    assert list(shared.collect()) == []  # nothing read yet: no figures, no second read
    assert time.monotonic() - began < 0.9
    started.join(10)
    assert slow.calls == 1


# -- against a real runworker ----------------------------------------------------------


def connections_of(pid):
    """Connections to the test database other than this test's own: PostgreSQL's and
    MariaDB's sessions; on SQLite, the worker process's open handles of the file."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
                "AND ID <> CONNECTION_ID()"
            )
            return cursor.fetchone()[0]
    name = str(Path(connection.settings_dict["NAME"]).resolve())
    found = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found += os.readlink(fd) == name
        except OSError:  # closed meanwhile
            continue
    return found


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_many_scrapes_at_once_open_one_connection(spawn):
    """Concurrent scrapes of ``runworker --metrics-port`` each opened a connection of
    their own (a role's connection limit was exhausted for other clients): now one
    scrape at a time reads the database, and the others get its figures."""
    port = free_port()
    worker = spawn(
        "runworker",
        HANDLER,
        "--metrics-port",
        str(port),
        "--metrics-address",
        "127.0.0.1",
        "--no-resetter",
    )
    wait_until(lambda: serving(port), 30, message="the metrics server")
    time.sleep(1.5)  # past REUSE_FOR: the first scrape of the storm reads again
    pid = worker.proc.pid
    before = max(connections_of(pid) for _ in range(20))
    most, answered, failed = before, [], []

    def scrape():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                answered.append(b"dbworker_jobs{" in r.read())
        except OSError as exc:
            failed.append(exc)

    for _ in range(ROUNDS):
        threads = [threading.Thread(target=scrape) for _ in range(SCRAPES)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            most = max(most, connections_of(pid))
        for thread in threads:
            thread.join(30)
        time.sleep(1.1)  # the next round reads the database again
    assert not failed, failed[:3]
    assert answered == [True] * (SCRAPES * ROUNDS)
    assert most - before <= 1, (before, most)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
