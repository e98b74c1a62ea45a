import math
import random

from django.core.management.base import BaseCommand, CommandError

from example_project.example.models import ExampleJob, Repository


class Command(BaseCommand):
    help = "Enqueue demo jobs for the example handler (some fail and are retried)."

    def add_arguments(self, parser):
        parser.add_argument("count", nargs="?", default="20", help="Jobs to enqueue (default 20).")
        parser.add_argument("--seconds", default="0.2", help="Fake work per job (default 0.2).")
        parser.add_argument(
            "--failing", default="0.2", help="Share of jobs that fail once or twice (default 0.2)."
        )
        parser.add_argument(
            "--tasks", action="store_true", help="Also enqueue a few django.tasks tasks."
        )

    def handle(self, *args, **options):
        count = parse(options["count"], "count", int, lambda n: n >= 1, "a whole number >= 1")
        seconds = parse(options["seconds"], "--seconds", float, lambda s: s >= 0, "a number >= 0")
        failing = parse(
            options["failing"], "--failing", float, lambda f: 0 <= f <= 1, "a number from 0 to 1"
        )
        repos = [
            Repository.objects.get_or_create(
                name=name, defaults={"url": f"https://example.com/{name}.git"}
            )[0]
            for name in ("django", "psycopg", "postgres", "sqlite")
        ]
        rng = random.Random(1)
        ExampleJob.objects.bulk_create(
            ExampleJob(
                repository=rng.choice(repos),
                seconds=seconds,
                fail_times=rng.choice((1, 2)) if rng.random() < failing else 0,
            )
            for _ in range(count)
        )
        self.stdout.write(f"enqueued {count} jobs")
        if options["tasks"]:
            from example_project.example.tasks import check_mirror, send_digest

            for repo in repos:
                send_digest.enqueue(repo.pk)
                check_mirror.enqueue(repo.pk, attempt_fails=1 if repo.name == "postgres" else 0)
            self.stdout.write(f"enqueued {2 * len(repos)} tasks (django.tasks)")


def parse(value, name, kind, valid, what):
    """``value`` as ``kind`` if ``valid``, or a one-line CommandError (nan and inf are
    refused: a job that sleeps forever is no demo)."""
    try:
        parsed = kind(value)
    except ValueError:
        parsed = None
    if parsed is None or not math.isfinite(parsed) or not valid(parsed):
        raise CommandError(f"{name} must be {what}, not {value!r}")
    return parsed
