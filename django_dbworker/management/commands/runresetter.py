from __future__ import annotations

import logging
import signal
import threading
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError

from django_dbworker import conf
from django_dbworker.handler import Handler
from django_dbworker.maintenance.resetter import ResetReport, Resetter
from django_dbworker.runtime.signals import SignalHandlers

from ._options import (
    WaitingCommand,
    add_task_arguments,
    check_tables,
    configure_logging,
    load_handlers,
    number,
    one_line,
)

logger = logging.getLogger("django_dbworker.resetter")


class Command(WaitingCommand):
    help = (
        "Reset stalled jobs: processing rows whose heartbeat is older than the handler's "
        "stalled_max_age go back to queued, or to failed once max_num_resets is spent."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "handlers", nargs="*", metavar="dotted.Handler", help="Handler classes to watch."
        )
        add_task_arguments(parser)
        parser.add_argument(
            "--startup-timeout",
            help="Seconds to wait for an unreachable database at start before failing "
            "(default: DBWORKER['STARTUP_TIMEOUT']).",
        )
        parser.add_argument(
            "--interval",
            help="Seconds between passes (default: DBWORKER['RESET_INTERVAL']).",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="Run one pass, print what it reset, and exit (1 if the pass failed).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(options["verbosity"])
        handlers = load_handlers(options["handlers"], tasks=options)
        interval = number(options["interval"], "--interval") or float(conf.get("RESET_INTERVAL"))
        check_tables(
            handlers, number(options["startup_timeout"], "--startup-timeout", inclusive=True)
        )
        names = ", ".join(h.get_name() for h in handlers)
        if options["once"]:
            logger.info("resetter: one pass for %s", names)
            self.report(self.run_once(handlers), options["verbosity"])
            return
        stop = threading.Event()
        signals = SignalHandlers()
        signals.install(lambda signum, frame: stop.set(), (signal.SIGTERM, signal.SIGINT))
        logger.info("resetter started for %s, every %gs", names, interval)
        try:
            code = Resetter(handlers).serve(interval, stop)
        finally:
            signals.restore()
        if code:
            raise SystemExit(code)

    @staticmethod
    def run_once(handlers: list[Handler]) -> list[ResetReport]:
        resetter = Resetter(handlers)
        try:
            return resetter.run_once()
        except DatabaseError as exc:
            raise CommandError(f"resetter pass failed: {one_line(exc)}") from exc
        finally:
            resetter.close()

    def report(self, reports: list[ResetReport], verbosity: int) -> None:
        """What the pass did, a line per handler (on stdout, for cron mails and scripts)."""
        if verbosity < 1:
            return
        for report in reports:
            self.stdout.write(
                f"{report.handler}: reset {plural(len(report.reset), 'stalled job')}, "
                f"failed {len(report.failed)}"
            )


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
