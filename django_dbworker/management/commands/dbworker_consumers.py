from __future__ import annotations

import getpass
from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import router

from django_dbworker.consumers.models import ConsumerCheckpoint, ConsumerGapSkip
from django_dbworker.consumers.operations import reset_checkpoint, set_paused
from django_dbworker.consumers.status import statuses
from django_dbworker.text import human_duration, printable


def behind(delta: timedelta | None) -> str:
    return "" if delta is None else f" (behind for {human_duration(delta)})"


class Command(BaseCommand):
    help = "Consumers: status (default), pause, resume, or reset a checkpoint."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "action",
            nargs="?",
            default="status",
            choices=["status", "pause", "resume", "reset-checkpoint"],
            help="What to do (default: %(default)s).",
        )
        parser.add_argument("names", nargs="*", metavar="name", help="Consumer names.")
        parser.add_argument(
            "--position", type=int, help="With reset-checkpoint: the new checkpoint."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = router.db_for_write(ConsumerCheckpoint)
        rows = ConsumerCheckpoint.objects.using(alias)
        names = options["names"]
        actor = f"dbworker_consumers ({getpass.getuser()})"
        unknown = set(names) - set(rows.filter(name__in=names).values_list("name", flat=True))
        if unknown:
            raise CommandError(f"no such consumer: {', '.join(sorted(unknown))}")
        action = options["action"]
        if action in ("pause", "resume"):
            if not names:
                raise CommandError(f"{action}: name the consumers")
            count = set_paused(rows.filter(name__in=names), action == "pause", actor)
            self.stdout.write(f"{action}d {count} consumer(s)")
        elif action == "reset-checkpoint":
            if len(names) != 1 or options["position"] is None:
                raise CommandError("reset-checkpoint: one name and --position N")
            if options["position"] < 0:
                raise CommandError("--position must be >= 0")
            old = reset_checkpoint(names[0], options["position"], actor, using=alias)
            self.stdout.write(f"{names[0]}: checkpoint {old} → {options['position']}")
        else:
            shown = rows.filter(name__in=names) if names else rows.all()
            for found in statuses(shown, alias):
                row = found.row
                skips = ConsumerGapSkip.objects.using(alias).filter(consumer=row.name).count()
                line = (
                    f"{row.name}: {found.state}, checkpoint {row.position}, "
                    f"lag {found.lag} rows{behind(found.behind_for)}, "
                    f"owner {row.owner or '-'}, running on {row.running_by or '-'}, "
                    f"{row.failures} failure(s) in a row, {skips} gap skip(s)"
                )
                self.stdout.write(printable(line))
