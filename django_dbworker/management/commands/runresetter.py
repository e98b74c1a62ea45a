from __future__ import annotations

import logging
import signal
import threading
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from django_dbworker import conf
from django_dbworker.resetter import Resetter

from ._options import check_tables, configure_logging, load_handlers, number

logger = logging.getLogger("django_dbworker.resetter")


class Command(BaseCommand):
    help = (
        "Reset stalled jobs: processing rows whose heartbeat is older than the handler's "
        "stalled_max_age go back to queued, or to failed once max_num_resets is spent."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "handlers", nargs="*", metavar="dotted.Handler", help="Handler classes to watch."
        )
        parser.add_argument(
            "--interval",
            help="Seconds between passes (default: DBWORKER['RESET_INTERVAL']).",
        )
        parser.add_argument("--once", action="store_true", help="Run one pass and exit.")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(options["verbosity"])
        handlers = load_handlers(options["handlers"])
        interval = number(options["interval"], "--interval") or float(conf.get("RESET_INTERVAL"))
        check_tables(handlers)
        stop = threading.Event()
        previous = {}
        if not options["once"]:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
        logger.info(
            "resetter started for %s, every %gs",
            ", ".join(h.get_name() for h in handlers),
            interval,
        )
        try:
            code = Resetter(handlers).serve(interval, stop, once=options["once"])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if code:
            raise SystemExit(code)
