from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, models, router, transaction
from django.db.models import Count

from django_dbworker.control.limits import limited_handlers, limits_usage
from django_dbworker.databases import everywhere
from django_dbworker.models import Pause, Schedule, WorkerJob, WorkerProcess
from django_dbworker.runtime.pool import pool_lines
from django_dbworker.schema import missing_table
from django_dbworker.states import JobState
from django_dbworker.text import plain_number, printable

from ._options import one_line


class Command(BaseCommand):
    help = (
        "Print how many jobs each job table holds per state, the usage of handlers' "
        "limits, and the registered workers (alive, or silent: no heartbeat for five "
        "intervals) with the database connections each holds."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "handlers",
            nargs="*",
            metavar="dotted.Handler",
            help="Handlers whose limits to show besides DBWORKER['HANDLERS'] and those "
            "the registered workers run.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        states = list(JobState.values)
        checkins: list[tuple[Any, Any]] = []
        self.stdout.write(f"{'job model':32}" + "".join(f"{s:>12}" for s in states))
        for model in apps.get_models():
            if not issubclass(model, WorkerJob):
                continue
            counts = dict(read(model, by_state))
            row = "".join(f"{counts.get(s, 0):>12}" for s in states)
            self.stdout.write(f"{model._meta.label:32}{row}")
            checkins += [(model, job) for job in read(model, reporting)]
        if checkins:
            self.stdout.write("\nrunning jobs' last check-in:")
        for model, (pk, progress) in checkins:
            self.stdout.write(printable(f"  {model._meta.label}:{pk}  {describe(progress)}"))
        for handler in limited_handlers(options["handlers"]):
            usage = guarded(handler.model, lambda h=handler: limits_usage(h))
            self.stdout.write(printable(f"\nlimits of {handler.get_name()}:"))
            for line in usage.lines():
                self.stdout.write(printable(f"  {line}"))
        # Pauses, schedules and registry rows live beside the jobs: in every database
        # that holds job tables (django_dbworker.databases).
        pauses = read_everywhere(Pause, lambda m: m.objects.all())
        if pauses:
            self.stdout.write("\npaused: " + printable(", ".join(p.name for p in pauses)))
        for s in read_everywhere(Schedule, lambda m: m.objects.filter(enabled=False)):
            self.stdout.write(printable(f"schedule switched off: {s.name}"))
        workers = merged(read_everywhere(WorkerProcess, lambda m: m.objects.all()))
        self.stdout.write(f"\n{len(workers)} worker process(es) registered")
        for worker in workers:
            status = "alive" if worker.is_alive() else "silent (dead?)"
            self.stdout.write(
                f"  {printable(worker.worker_id)}  {status}  jobs in flight: {worker.num_jobs}  "
                f"connections: {worker.num_connections}  "
                f"last heartbeat: {worker.last_heartbeat_at:%Y-%m-%d %H:%M:%S} "
                f"({worker.seconds_since_heartbeat():.0f}s ago)"
            )
            for line in pool_lines(worker.pool):
                self.stdout.write(printable(f"    {line}"))


def reporting(model: type[models.Model]) -> Any:
    """The running jobs that checked in (at most 20, newest claims first)."""
    running = model._base_manager.filter(state=JobState.PROCESSING, progress__isnull=False)
    return running.order_by("-started_at").values_list("pk", "progress")[:20]


def describe(progress: Any) -> str:
    if not isinstance(progress, dict):
        return str(progress)
    parts = [str(progress["text"])] if progress.get("text") else []
    done, total = progress.get("done"), progress.get("total")
    if isinstance(done, int | float) and isinstance(total, int | float) and total > 0:
        parts.append(f"{plain_number(done)}/{plain_number(total)} ({100 * done / total:.0f}%)")
    return "  ".join(parts)


def by_state(model: type[models.Model]) -> Any:
    return model._base_manager.values_list("state").annotate(n=Count("pk")).order_by()


def read(model: type[models.Model], query: Any, using: str | None = None) -> list[Any]:
    """The rows ``query(model)`` returns (from ``using``, else where the router reads
    ``model``), or a one-line ``CommandError`` saying why not (a missing table and what
    to run, or the database error)."""
    alias = using or router.db_for_read(model)
    rows: list[Any] = guarded(model, lambda: list(query(model).using(alias)), alias)
    return rows


def read_everywhere(model: type[models.Model], query: Any) -> list[Any]:
    """``read`` from each database that holds job tables (the package's rows live
    beside them), in turn."""
    return [row for alias in everywhere(model) for row in read(model, query, alias)]


def merged(workers: list[WorkerProcess]) -> list[WorkerProcess]:
    """A worker that serves several databases has a registry row in each: one row per
    worker, with its jobs in flight summed and its latest heartbeat."""
    found: dict[str, WorkerProcess] = {}
    for worker in workers:
        first = found.setdefault(worker.worker_id, worker)
        if first is not worker:
            first.num_jobs += worker.num_jobs
            first.last_heartbeat_at = max(first.last_heartbeat_at, worker.last_heartbeat_at)
    return list(found.values())


def guarded(model: type[models.Model], call: Any, using: str | None = None) -> Any:
    """``call()``, which reads ``model``'s table, or a one-line ``CommandError``."""
    alias = using or router.db_for_read(model)
    try:
        # A savepoint when called inside a transaction: PostgreSQL refuses any
        # further statement (the table check below) in a transaction that failed.
        with transaction.atomic(using=alias):
            return call()
    except DatabaseError as exc:
        try:
            problem = missing_table(model, alias)
        except DatabaseError:
            problem = None
        message = problem or (
            f"cannot read {model._meta.label} from database {alias!r}: {one_line(exc)}"
        )
        raise CommandError(message) from exc
