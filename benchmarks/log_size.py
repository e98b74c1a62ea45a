"""What a large execution log costs: the bytes of each log write, the job page's size.

    DBWORKER_TEST_SQLITE=/tmp/log_size.sqlite3 python -m benchmarks.log_size \
        [--entries 300] [--size 100000] [--pause 0.02]

On the test project (``tests.settings``: SQLite unless ``DATABASE_URL`` says
otherwise; migrated first), a worker runs one job whose handler logs ``--entries``
entries of ``--size`` characters each, ``--pause`` seconds apart (as commands would
take: the writer then writes the log once per entry; ``BehaviorHandler``'s
``big_log``). Prints as
JSON: how many log writes the worker made and the bytes of their JSON (largest, mean,
total), the size of the log the row keeps, and the bytes of the admin's job page and
of its live refresh (one response of the 2-second poll) for that row and for a row
holding the whole log (as a release without bounds, or plain SQL, wrote it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.urls import reverse  # noqa: E402

from django_dbworker.runtime.attempt import Attempt  # noqa: E402
from django_dbworker.runtime.worker import Worker  # noqa: E402
from tests.testapp.handlers import BehaviorHandler  # noqa: E402
from tests.testapp.models import QueueJob  # noqa: E402


def measure(entries: int, size: int, pause: float) -> dict[str, object]:
    written: list[int] = []
    take_logs = Attempt.take_logs

    def counting(self: Attempt) -> str | None:
        data = take_logs(self)
        if data is not None:
            written.append(len(data.encode()))
        return data

    Attempt.take_logs = counting  # type: ignore[method-assign]
    job = QueueJob.objects.create(
        behavior="big_log", payload={"entries": entries, "size": size, "pause": pause}
    )
    Worker([BehaviorHandler()], burst=True, install_signal_handlers=False).run()
    Attempt.take_logs = take_logs  # type: ignore[method-assign]
    job.refresh_from_db()
    whole = QueueJob.objects.create(
        state="processing",
        execution_logs=[
            {"key": f"step-{i}", "command": ["make"], "out": "x" * size, "exit_code": 0}
            for i in range(entries)
        ],
    )
    user = get_user_model().objects.filter(username="log-size").first()
    if user is None:
        user = get_user_model().objects.create_superuser("log-size", "", "pw")
    client = Client()
    client.force_login(user)

    def page(pk: object) -> int:
        return len(client.get(reverse("admin:testapp_queuejob_change", args=[pk])).content)

    def live(pk: object) -> int:
        url = reverse("admin:testapp_queuejob_dbworker", args=[pk, "live"])
        return len(client.get(url).content)

    return {
        "log_writes": len(written),
        "bytes_per_write_max": max(written, default=0),
        "bytes_per_write_mean": round(statistics.mean(written)) if written else 0,
        "bytes_written_total": sum(written),
        "row_log_bytes": len(json.dumps(job.execution_logs).encode()),
        "row_log_entries": len(job.execution_logs),
        "page_bytes_worker_row": page(job.pk),
        "live_bytes_worker_row": live(job.pk),
        "page_bytes_whole_log_row": page(whole.pk),
        "live_bytes_whole_log_row": live(whole.pk),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--pause", type=float, default=0.02)
    options = parser.parse_args()
    setup_test_environment()  # the test client's hosts
    call_command("migrate", verbosity=0)
    print(json.dumps(measure(options.entries, options.size, options.pause), indent=1))


if __name__ == "__main__":
    main()
