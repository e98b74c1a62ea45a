from __future__ import annotations

import difflib
import getpass
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_dbworker.control.models import Schedule
from django_dbworker.control.pause import pause, paused, resume
from django_dbworker.control.schedules import schedule_alias, set_schedule_enabled
from django_dbworker.known import pause_problem
from django_dbworker.text import printable

from .dbworker_status import read_everywhere


class Command(BaseCommand):
    help = (
        "Operator controls: pause or resume a handler (or one queue: NAME:QUEUE, "
        "tasks:BACKEND:QUEUE), list them, list schedules and switch them on or off."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        p = sub.add_parser("pause", help="Stop claims of a handler or queue (running jobs finish).")
        p.add_argument("name")
        p.add_argument("--reason", default="")
        p.add_argument(
            "--force",
            action="store_true",
            help="Pause a name no handler of the settings or the worker registry has yet.",
        )
        sub.add_parser("resume", help="Claim the jobs of a paused name again.").add_argument("name")
        sub.add_parser("paused", help="List what is paused.")
        sub.add_parser("schedules", help="List the periodic schedules workers registered.")
        for action, text in (("enable", "on"), ("disable", "off")):
            sub.add_parser(action, help=f"Switch a schedule {text}.").add_argument("schedule")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        by = f"{getpass.getuser()} (manage.py)"
        if action == "pause":
            if not options["force"]:
                problem = pause_problem(options["name"])
                if problem:
                    raise CommandError(f"{problem} (--force pauses it anyway)")
            done = pause(options["name"], by=by, reason=options["reason"], source="command")
            self._say(done, f"{options['name']}: paused", f"{options['name']}: paused already")
        elif action == "resume":
            name = options["name"]
            done = resume(name, by=by, source="command")
            close = [] if done else difflib.get_close_matches(name, sorted(paused()), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self._say(done, f"{name}: resumed", f"{name}: was not paused{hint}")
        elif action == "paused":
            for p in paused().values():
                since = f"{p.paused_at:%Y-%m-%d %H:%M:%S}"
                why = f" ({p.reason})" if p.reason else ""
                line = f"{p.name}  since {since} by {p.paused_by or '?'}{why}"
                self.stdout.write(printable(line))
        elif action == "schedules":
            for s in read_everywhere(Schedule, lambda m: m.objects.all()):
                nxt = f"{s.next_tick:%Y-%m-%d %H:%M:%S}" if s.next_tick else "-"
                last = f"{s.last_tick:%Y-%m-%d %H:%M:%S}" if s.last_tick else "never"
                line = (
                    f"{s.name}  {'on' if s.enabled else 'OFF'}  {s.expression!r} {s.timezone}  "
                    f"next {nxt} UTC  last {last}  {s.last_job}"
                )
                self.stdout.write(printable(line))
        else:
            name, on = options["schedule"], action == "enable"
            changed = set_schedule_enabled(name, on, by=by, source="command")
            if not changed and schedule_alias(name) is None:
                raise CommandError(
                    f"no schedule {name!r}: `manage.py dbworker schedules` lists them "
                    "(a worker registers a schedule when it first runs it)"
                )
            self.stdout.write(printable(f"{name}: {'on' if on else 'off'}"))

    def _say(self, done: bool, yes: str, no: str) -> None:
        self.stdout.write(printable(yes if done else no))
