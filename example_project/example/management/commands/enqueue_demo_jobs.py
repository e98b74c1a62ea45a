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

    def handle(self, *args, **options):
        try:
            count = int(options["count"])
            seconds = float(options["seconds"])
            failing = float(options["failing"])
        except ValueError as exc:
            raise CommandError(f"bad number: {exc}") from None
        if count < 1 or seconds < 0 or not 0 <= failing <= 1:
            raise CommandError("count must be >= 1, --seconds >= 0, --failing in [0, 1]")
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
