from __future__ import annotations

import os
import sys
from argparse import ArgumentParser, BooleanOptionalAction
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connections

from django_dbworker import conf
from django_dbworker.contrib import METRICS_CHILD
from django_dbworker.exceptions import WorkerStartError
from django_dbworker.maintenance import maintenance_factory
from django_dbworker.runtime.signals import hold_early_signals
from django_dbworker.runtime.supervisor import (
    CHILD,
    Supervisor,
    changed_files,
    child_command,
    in_terminal_foreground,
)
from django_dbworker.runtime.worker import FORCE_WAIT, Worker

from ._consumers import split_consumers
from ._options import (
    WaitingCommand,
    add_task_arguments,
    check_tables,
    configure_logging,
    load_handlers,
    load_prometheus,
    number,
)


class Command(WaitingCommand):
    help = (
        "Run a worker process: claim jobs of the given handlers (or of "
        "settings.DBWORKER['HANDLERS']) and process them until stopped. SIGTERM or "
        "Ctrl-C drains; a second one stops running jobs."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "handlers",
            nargs="*",
            metavar="dotted.Handler",
            help="Handler classes to run, and consumer classes (django_dbworker.consumers."
            "Consumer subclasses) to run beside them.",
        )
        add_task_arguments(parser)
        parser.add_argument(
            "--num-handlers", help="Jobs run at once per handler (overrides num_handlers)."
        )
        parser.add_argument(
            "--startup-timeout",
            help="Seconds to wait for an unreachable database at start before failing "
            "(default: DBWORKER['STARTUP_TIMEOUT']).",
        )
        parser.add_argument(
            "--interval", help="Seconds between claims while idle (overrides interval)."
        )
        parser.add_argument(
            "--prefetch", help="Jobs claimed beyond free handler threads (overrides prefetch)."
        )
        parser.add_argument(
            "--pool",
            help="Run every handler on one pool of this many slots, handed to the handlers "
            "with jobs in proportion to their weight (default: DBWORKER['POOL']; none: each "
            "handler has num_handlers threads).",
        )
        parser.add_argument(
            "--processes",
            default="1",
            help="Worker processes to run under one supervisor that forwards signals and "
            "restarts crashed ones (default: %(default)s).",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit once nothing is left to claim."
        )
        parser.add_argument(
            "--until-done",
            action="store_true",
            help="Exit once none of the handlers' jobs is left unfinished: queued (also for "
            "later), running, or waiting for a retry.",
        )
        parser.add_argument(
            "--reload",
            action=BooleanOptionalAction,
            default=None,
            help="Restart the worker process (draining it) when a Python file of the project "
            "changes, as runserver does (default: on with DEBUG).",
        )
        parser.add_argument("--max-jobs", help="Exit after this many jobs.")
        parser.add_argument("--max-time", help="Stop claiming after this many seconds.")
        parser.add_argument(
            "--shutdown-timeout",
            default="30",
            help="Seconds running jobs get to finish on SIGTERM (default: %(default)s).",
        )
        parser.add_argument(
            "--no-resetter",
            action="store_true",
            help="Do not reset stalled jobs from this process (run runresetter instead).",
        )
        parser.add_argument(
            "--metrics-port",
            help="Serve Prometheus metrics on this port at /metrics (with --processes, the "
            "sum of all worker processes). Needs prometheus-client.",
        )
        parser.add_argument(
            "--metrics-address",
            default="127.0.0.1",
            help="Address the metrics are served on (default: %(default)s; 0.0.0.0 for a "
            "scraper on another machine).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # A SIGTERM or Ctrl-C while it starts (checks, waiting for the database, the
        # metrics server) stops it before it claims anything, cleanly.
        held = hold_early_signals()
        try:
            self._handle(options)
        finally:
            held.restore()

    def _handle(self, options: dict[str, Any]) -> None:
        configure_logging(options["verbosity"])
        worker_options = {
            "burst": options["burst"],
            "until_done": options["until_done"],
            "max_jobs": number(options["max_jobs"], "--max-jobs", kind=int),
            "max_time": number(options["max_time"], "--max-time"),
            "shutdown_timeout": number(
                options["shutdown_timeout"], "--shutdown-timeout", inclusive=True
            ),
        }
        processes = number(options["processes"], "--processes", kind=int)
        pool = number(options["pool"], "--pool", kind=int)
        worker_options["pool"] = pool if pool is not None else conf.get("POOL")
        handler_paths, consumers = split_consumers(options["handlers"])
        only_consumers = bool(consumers) and not handler_paths and not options["tasks"]
        handlers = (
            []
            if only_consumers
            else load_handlers(
                handler_paths,
                tasks=options,
                num_handlers=number(options["num_handlers"], "--num-handlers", kind=int),
                interval=number(options["interval"], "--interval"),
                prefetch=number(options["prefetch"], "--prefetch", kind=int, inclusive=True),
            )
        )
        check_tables(
            handlers, number(options["startup_timeout"], "--startup-timeout", inclusive=True)
        )
        metrics_port = number(options["metrics_port"], "--metrics-port", kind=int)
        prometheus = load_prometheus() if metrics_port or os.environ.get(METRICS_CHILD) else None
        # Neither the supervisor nor a worker's main thread uses Django's own
        # connections (a worker opens its own): do not hold check_tables' one.
        connections.close_all()
        reload = settings.DEBUG if options["reload"] is None else options["reload"]
        reload = reload and not os.environ.get(CHILD)
        # In a terminal's foreground, a Ctrl-C would also reach what the handlers started:
        # one worker process of its own session under a supervisor keeps them out of it.
        terminal = processes == 1 and in_terminal_foreground()
        if (processes > 1 or reload or terminal) and not settings.SETTINGS_MODULE:
            if processes > 1 or options["reload"]:
                raise CommandError(
                    f"{'--processes' if processes > 1 else '--reload'} needs a settings module "
                    "(DJANGO_SETTINGS_MODULE or --settings)"
                )
            reload = terminal = False
        if processes > 1 or reload or terminal:
            command, env = child_command(self._child_args(options))
            grace = worker_options["shutdown_timeout"] + FORCE_WAIT + 10
            served = None
            if prometheus is not None and metrics_port:
                served = prometheus.SupervisorMetrics(
                    metrics_port, options["metrics_address"], handlers
                )
                env.update(served.env)
            try:
                code = Supervisor(
                    command,
                    processes,
                    grace=grace,
                    env=env,
                    on_exit=served.exited if served else None,
                    restart=processes > 1,
                    watch=changed_files() if reload else None,
                    finishes=options["burst"] or options["until_done"],
                ).run()
            finally:
                if served is not None:
                    served.close()
        else:
            observers = []
            if prometheus is not None:
                observers = prometheus.worker_observers(
                    metrics_port, options["metrics_address"], handlers
                )
            try:
                maintenance = maintenance_factory(handlers, reset=not options["no_resetter"])
                companions = []
                if consumers:
                    from django_dbworker.consumers.runner import ConsumerRunner

                    companions.append(ConsumerRunner(consumers))
                code = Worker(
                    handlers,
                    maintenance=maintenance,
                    observers=observers,
                    companions=companions,
                    **worker_options,
                ).run()
            except WorkerStartError as exc:
                raise CommandError(str(exc)) from None
        if code:
            sys.exit(code)

    @staticmethod
    def _child_args(options: dict[str, Any]) -> list[str]:
        """This command's arguments, minus --processes, for each child."""
        args = [*options["handlers"], "-v", str(options["verbosity"])]
        for name in (
            "num_handlers",
            "interval",
            "prefetch",
            "max_jobs",
            "max_time",
            "shutdown_timeout",
            "startup_timeout",
            "pool",
        ):
            if options[name] is not None:
                args += [f"--{name.replace('_', '-')}", str(options[name])]
        for flag in ("burst", "until_done", "no_resetter", "tasks"):
            if options[flag]:
                args.append(f"--{flag.replace('_', '-')}")
        for name in ("backend", "queue"):
            for value in options[name] or []:
                args += [f"--{name}", value]
        return args
