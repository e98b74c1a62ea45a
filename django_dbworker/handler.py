"""The ``Handler`` base class: the hooks a worker calls and the options it reads."""

from __future__ import annotations

import difflib
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.db.models import Model, Q, QuerySet

from .exceptions import NonRetryableError

if TYPE_CHECKING:
    from .control.limits import RateLimit
    from .control.periodic import Periodic
    from .runtime.attempt import Attempt
    from .runtime.outcome import Outcome

#: The attempt being run. A context variable, not a thread-local: it follows the
#: handler into ``async def`` hooks (asgiref copies the context both ways).
_current: ContextVar[Attempt | None] = ContextVar("dbworker_attempt", default=None)


def current_attempt() -> Attempt | None:
    """The attempt the calling handler (thread or coroutine) is running, if any."""
    return _current.get()


def set_current_attempt(attempt: Attempt | None) -> None:
    _current.set(attempt)


def seconds(value: timedelta | float | None) -> float | None:
    """Options accept a ``timedelta`` or a number of seconds."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)


class Handler:
    """Processes the jobs of one ``WorkerJob`` model.

    Subclass it, set ``model`` and override ``handle``. Every option is a class
    attribute; ``runworker`` may override some per process (``--num-handlers``).
    One instance serves all the handler threads of a worker process, so keep
    per-job state on the job or in ``self.attempt``, not on ``self``.
    """

    #: The job model (a concrete subclass of ``WorkerJob``). Required.
    model: ClassVar[type[Model] | None] = None
    #: Shown in logs and in the worker registry; defaults to the dotted class path.
    name: ClassVar[str] = ""
    #: Claim order: model field names, ``-`` for descending. Only concrete fields.
    ordering: ClassVar[Sequence[str]] = ("pk",)
    #: Static extra claim conditions, e.g. ``Q(queue="emails")``. Keeps batch claims.
    dequeue_filter: ClassVar[Q | None] = None
    #: Jobs this process runs at once (one thread each).
    num_handlers: int = 1
    #: Delay between two claim attempts after a claim found nothing. Each further
    #: empty claim doubles it, up to ``max_interval``; any work found resets it.
    interval: timedelta | float = timedelta(seconds=1)
    #: Longest delay between two claims while idle. None: five times ``interval``.
    #: On PostgreSQL a NOTIFY wakes idle workers at once (see ``DBWORKER["NOTIFY"]``);
    #: what it does not cover (``process_after`` coming due, rows inserted by plain
    #: SQL) is picked up within this.
    max_interval: timedelta | float | None = None
    #: How often the worker refreshes ``last_heartbeat_at`` of the jobs it holds
    #: (and sees ``cancel`` and deleted rows).
    heartbeat_interval: timedelta | float = timedelta(seconds=1)
    #: Failures after the first that are retried; 0 makes the first error final.
    max_num_retries: int = 0
    #: Times a job may snooze (``raise Snooze(seconds)``) before the next snooze fails
    #: it instead; snoozes use no retry. None: no cap.
    max_snoozes: int | None = 100
    #: Delay before an errored job is claimed again.
    retry_after: timedelta | float = timedelta(seconds=10)
    #: Each further retry waits ``retry_backoff`` times longer (1 = constant).
    retry_backoff: float = 1.0
    #: Upper bound of the retry delay when ``retry_backoff`` > 1.
    retry_max_delay: timedelta | float | None = None
    #: A processing job whose heartbeat is older than this is reset by the resetter.
    stalled_max_age: timedelta | float = timedelta(seconds=30)
    #: Resets before a stalled job is failed instead ("poison job" protection).
    max_num_resets: int = 3
    #: Past this the attempt is asked to stop, and errors (fails once its retries are
    #: spent) whatever the handler does after. None: no limit.
    maximum_runtime_per_job: timedelta | float | None = None
    #: How long past ``maximum_runtime_per_job`` a handler asked to stop may take to
    #: return; then the worker writes the attempt's outcome without it, and leaves its
    #: thread (which keeps its slot until it returns) behind.
    maximum_runtime_grace: timedelta | float = timedelta(seconds=5)
    #: With ``runworker --pool N`` (one pool of slots for every handler of the process):
    #: this handler's share of the slots, in proportion to the weights of the handlers
    #: that have jobs (1-100,000; docs/flow-control.md § Shared pool).
    weight: int = 100
    #: Jobs claimed ahead of free handler threads, so short jobs are claimed in
    #: batches (one claim per ``prefetch + 1`` jobs or more) instead of one by one.
    #: A prefetched job waits in this process for a thread (its ``started_at`` is the
    #: claim time), so keep 0 for long jobs shared among several workers. Ignored
    #: with ``pre_dequeue`` (it decides job by job).
    prefetch: int = 0
    #: Write each completion in its own statement as soon as its handler returns,
    #: instead of grouping the completions at hand into one statement (group commit).
    ack_each_job: bool = False
    #: Inject ``JobCanceled`` into the handler thread on cancellation, instead of
    #: only flagging ``self.attempt.canceled``. See docs/reference.md for caveats.
    interrupt_on_cancel: bool = False
    #: A JSON field of the model where the completion stores what ``handle()``
    #: returned (in the same statement). None: return values are ignored.
    result_field: ClassVar[str | None] = None
    #: A JSON list field of the model: each attempt that raises appends
    #: ``{"exception_class_path", "traceback", "worker"}`` (in the same statement).
    errors_field: ClassVar[str | None] = None
    #: A JSON list field of the model: each claim appends the worker's id.
    attempts_field: ClassVar[str | None] = None
    #: A datetime field of the model: a job's first claim sets it to the claim's time,
    #: later claims keep it (``started_at`` is each attempt's own).
    first_claim_field: ClassVar[str | None] = None
    #: How long finished jobs are kept, per final state, e.g.
    #: ``{"completed": timedelta(days=7), "failed": timedelta(days=30)}``; the
    #: worker deletes older ones in small batches. None: they are kept.
    retention: ClassVar[Mapping[str, timedelta | float] | None] = None
    #: A field naming each job's queue: besides the whole handler (``manage.py dbworker
    #: pause <name>``), one queue can be paused (``pause <name>:<queue>``).
    queue_field: ClassVar[str | None] = None
    #: Most jobs of this handler claimed at once by every worker together (running or
    #: prefetched, until their outcome is written). None: no limit but ``num_handlers``
    #: per process. See docs/flow-control.md.
    max_concurrency: int | None = None
    #: A field of the model whose value groups jobs for the per-key limits
    #: (``max_concurrency_per_key``, ``rate_limit_per_key``), e.g. ``"tenant_id"``.
    #: Jobs whose value is NULL are not limited per key.
    concurrency_key: str | None = None
    #: Most jobs of one ``concurrency_key`` value claimed at once by every worker
    #: together; 1 runs each key's jobs one at a time, in ``ordering``.
    max_concurrency_per_key: int | None = None
    #: Most claims per period by every worker together: ``"100/m"``, ``"5/s"``, or a
    #: ``django_dbworker.RateLimit`` (to set its burst). Jobs over it wait.
    rate_limit: str | RateLimit | None = None
    #: ``rate_limit`` for each ``concurrency_key`` value on its own.
    rate_limit_per_key: str | RateLimit | None = None
    #: A field of the model whose values share the claims fairly (tenants): each value
    #: with jobs waiting gets its share of the free slots, in proportion to its weight,
    #: instead of the oldest jobs going first whoever they belong to. Within a value,
    #: ``ordering`` holds. Declare ``fair_index(fair_by, ...)`` on the model
    #: (docs/flow-control.md § Fair claims).
    fair_by: ClassVar[str | None] = None
    #: The weight of each ``fair_by`` value: a dict (value -> number > 0) or a method
    #: ``fair_weights(self, value)``, asked at most once a second per value (every 10 s
    #: on MariaDB); others weigh 1.
    fair_weights: ClassVar[Mapping[Any, float] | Callable[..., float] | None] = None
    #: Periodic schedules that enqueue jobs of ``model`` (``django_dbworker.Periodic``).
    schedules: ClassVar[Sequence[Periodic]] = ()
    #: The fields ``model.objects.enqueue_unique()`` keeps this handler's jobs unique by:
    #: declared so the system check dbworker.W004 finds a missing unique constraint.
    unique_by: ClassVar[Sequence[str]] = ()
    #: Middleware around this handler's attempts, inside ``DBWORKER["MIDDLEWARE"]``:
    #: factories or their dotted paths, outermost first (``django_dbworker.middleware``).
    middleware: ClassVar[Sequence[str | Callable[..., Any]]] = ()
    #: Run ``handle()`` (and ``complete()``) inside a transaction on the job's database
    #: that also writes the job's completion, fenced to the attempt: the handler's
    #: writes commit with its outcome or not at all (docs/transactions.md).
    atomic: bool = False
    #: Failure message the resetter writes when ``max_num_resets`` is spent.
    reset_failure_message: ClassVar[str] = (
        "job processor died while handling this job too many times"
    )

    def __init__(self, **options: Any) -> None:
        for key, value in options.items():
            if not hasattr(type(self), key) or key.startswith("_"):
                raise TypeError(f"{type(self).__name__} has no option {key!r}")
            setattr(self, key, value)

    # -- identity --------------------------------------------------------------------

    def get_name(self) -> str:
        """``name``, or the dotted path of the class. Works on the class too
        (``Handler.get_name(SomeHandler)``)."""
        owner = self if isinstance(self, type) else type(self)
        return self.name or f"{owner.__module__}.{owner.__qualname__}"

    def __repr__(self) -> str:
        return f"<{self.get_name()}>"

    def periodic_schedules(self) -> list[Periodic]:
        """``schedules``, each named (by default ``<handler name>:<cron>``). Works on
        the class too, like ``get_name``."""
        name = Handler.get_name(self)
        return [p.named(f"{name}:{p.cron}") for p in self.schedules]

    def enqueue_scheduled(self, periodic: Periodic) -> Model:
        """Enqueue the job of one tick of ``periodic`` (inside the scheduler's
        transaction): by default a row of ``model`` with ``periodic.fields``."""
        assert self.model is not None
        job = self.model(**periodic.fields)
        job.save()
        return job

    def queue_pause_prefix(self) -> str:
        """What the name of a pause of one queue (``queue_field``) starts with."""
        return f"{self.get_name()}:"

    # -- hooks -----------------------------------------------------------------------

    def get_queryset(self) -> QuerySet[Any]:
        """Load claimed jobs through this queryset (the seeds' "view").

        Override to eager-load what ``handle`` needs, e.g. ``select_related``.
        It is used to fetch the rows a claim returned; it does not narrow the
        claim (use ``dequeue_filter`` or ``pre_dequeue`` for that).
        """
        assert self.model is not None
        return self.model._base_manager.all()

    def pre_dequeue(self) -> object:
        """Called before each claim. Return False for "not now" (the worker waits
        ``interval``), a ``Q`` of extra conditions for this claim, or True/None.

        A handler that overrides this claims one job per call, so a budget it
        enforces holds per job.
        """
        return True

    def pre_handle(self, job: Any) -> object:
        """Runs in the handler thread before ``handle``. Raising fails the attempt."""

    def handle(self, job: Any) -> object:
        """Do the work. Returning completes the job; raising errors it (retryable
        unless ``NonRetryableError`` or ``is_retryable`` says otherwise)."""
        raise NotImplementedError(f"{type(self).__name__} must define handle(job)")

    def complete(self, job: Any, result: Any) -> None:
        """The complete phase: runs after ``handle`` returned ``result``, inside the
        transaction that writes the job's completion (fenced to the attempt), so what
        it writes commits with the outcome or not at all. ``handle`` itself runs
        outside any transaction unless ``atomic`` (docs/transactions.md)."""

    def post_handle(self, job: Any, outcome: Outcome) -> None:
        """Runs after every attempt, whatever its outcome. Errors are logged only."""

    def is_retryable(self, error: BaseException) -> bool:
        return not isinstance(error, NonRetryableError)

    # -- helpers ---------------------------------------------------------------------

    @property
    def attempt(self) -> Attempt:
        """The attempt this handler thread is running: cancellation state and the
        execution log. Only valid inside hooks the worker calls."""
        attempt = current_attempt()
        if attempt is None:
            raise RuntimeError("self.attempt is only available while a worker runs a job")
        return attempt

    def retry_budget(self, job: Any) -> int:
        """Failures after the first that ``job`` may have retried (``max_num_retries``;
        override for a budget per job)."""
        return self.max_num_retries

    def shown_retry_budget(self, job: Any) -> int:
        """``retry_budget(job)`` as the admin shows it: what it can tell without running
        code the row names (a web process imports only what the settings name)."""
        return self.retry_budget(job)

    def maximum_runtime(self, job: Any) -> float | None:
        """Seconds an attempt at ``job`` may run (``maximum_runtime_per_job``)."""
        return seconds(self.maximum_runtime_per_job)

    def retry_delay(self, num_failures: int, job: Any = None) -> float:
        """Seconds to wait before retry number ``num_failures`` (1 = first)."""
        delay = (seconds(self.retry_after) or 0.0) * self.retry_backoff ** max(num_failures - 1, 0)
        cap = seconds(self.retry_max_delay)
        return min(delay, cap) if cap is not None else delay

    def pool_ceiling(self, size: int) -> int:
        """Most of this handler's jobs a shared pool of ``size`` slots runs at once:
        ``num_handlers`` where it is set (on the class or the instance: ``runworker
        --num-handlers``), else the whole pool."""
        declared = "num_handlers" in vars(self) or any(
            "num_handlers" in vars(klass)
            for klass in type(self).__mro__
            if klass is not Handler and issubclass(klass, Handler)
        )
        return min(self.num_handlers, size) if declared else size

    def uses_pre_dequeue(self) -> bool:
        return type(self).pre_dequeue is not Handler.pre_dequeue

    def uses_custom_queryset(self) -> bool:
        return type(self).get_queryset is not Handler.get_queryset

    def uses_complete(self) -> bool:
        return type(self).complete is not Handler.complete

    def is_atomic(self, job: Any) -> bool:
        """Whether the attempt at ``job`` is atomic (``atomic``; the tasks backend
        decides per task)."""
        return bool(self.atomic)

    def transactional(self) -> bool:
        """Whether an attempt's outcome commits with the handler's writes (``atomic``,
        or a ``complete`` phase)."""
        return bool(self.atomic) or self.uses_complete()

    def uses_post_handle(self) -> bool:
        return type(self).post_handle is not Handler.post_handle


def known_handlers(paths: Iterable[str] = ()) -> list[Handler]:
    """The handlers a project names: ``paths`` (dotted) and ``DBWORKER["HANDLERS"]``,
    each imported and built without arguments, one per name; those that cannot be are
    left out.

    Never a name read from the database: the worker registry's handler names are
    labels (what a worker reports of itself), not code to import. A row of that table
    must not make a web process import a module or build a class it names."""
    from . import conf

    found: dict[str, Handler] = {}
    for path in dict.fromkeys([*paths, *conf.get("HANDLERS")]):
        try:
            handler = import_handler(path)()
        except (HandlerImportError, TypeError):
            continue
        found.setdefault(handler.get_name(), handler)
    return list(found.values())


class HandlerImportError(Exception):
    """A dotted path that does not name a ``Handler`` subclass.

    When the path is right but its module raised while being imported, the
    module's exception is the ``__cause__`` (so ``--traceback`` shows it).
    """


def import_handler(path: str) -> type[Handler]:
    """The ``Handler`` subclass ``path`` names (``package.module.ClassName``).

    Tells a wrong path (no such module, no such attribute) from a module that
    exists but raised while being imported, which may well be an ``ImportError``
    of its own.
    """
    import importlib

    module_path, _, attr = path.rpartition(".")
    if not module_path or not attr:
        raise HandlerImportError(
            f"cannot import handler {path!r}: not a dotted path (package.module.ClassName)"
        )
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_path + ".").startswith(exc.name + "."):
            raise HandlerImportError(
                f"cannot import handler {path!r}: no module named {exc.name!r}"
            ) from None
        raise HandlerImportError(_raised(path, module_path, exc)) from exc
    except Exception as exc:
        raise HandlerImportError(_raised(path, module_path, exc)) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        handlers = [
            name
            for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, Handler) and value is not Handler
        ]
        close = difflib.get_close_matches(attr, handlers, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise HandlerImportError(
            f"cannot import handler {path!r}: module {module_path!r} has no attribute "
            f"{attr!r}{hint}"
        ) from None
    if not (isinstance(obj, type) and issubclass(obj, Handler)):
        raise HandlerImportError(
            f"{path!r} is not a Handler subclass (it is {type(obj).__name__} {obj!r})"
        )
    return obj


def _raised(path: str, module_path: str, exc: BaseException) -> str:
    """One line saying what the module of ``path`` raised, and where."""
    where = ""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<frozen ")
    ]
    # A SyntaxError's message already names the file and line.
    if frames and not isinstance(exc, SyntaxError):
        where = f" (at {frames[-1].filename}, line {frames[-1].lineno})"
    message = " ".join(str(exc).split())
    return (
        f"handler {path!r}: importing module {module_path!r} raised "
        f"{type(exc).__name__}: {message}{where}"
    )
