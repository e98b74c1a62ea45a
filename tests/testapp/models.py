import uuid
from typing import Any

from django.db import models

from django_dbworker import unique_job_constraint
from django_dbworker.models import JobState, WorkerJob, dequeue_index, fair_index, worker_index
from django_dbworker.partitions import PartitionedWorkerJob


class Repository(models.Model):
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


class QueueJob(WorkerJob):
    """A job whose ``behavior`` and ``payload`` tell the test handler what to do."""

    repository = models.ForeignKey(Repository, null=True, blank=True, on_delete=models.CASCADE)
    behavior = models.CharField(max_length=40, default="ok")
    payload = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    size = models.IntegerField(default=1)

    class Meta(WorkerJob.Meta):
        indexes = [
            *WorkerJob.Meta.indexes,
            dequeue_index("-priority", "id", name="testapp_queuejob_prio_dq"),
            # The opt-in index of the admin's worker filter (test_admin_dashboard).
            worker_index(name="testapp_queuejob_worker"),
        ]


class ReportJob(WorkerJob):
    """Jobs unique per (tenant, kind) while active, and per (tenant, hour) for good;
    each in a ``queue`` that can be paused on its own."""

    tenant = models.CharField(max_length=40)
    kind = models.CharField(max_length=40, default="daily")
    hour = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001 - NULL: no period key
    queue = models.CharField(max_length=40, default="default")
    payload = models.JSONField(default=dict, blank=True)

    class Meta(WorkerJob.Meta):
        constraints = [
            *WorkerJob.Meta.constraints,
            unique_job_constraint("tenant", "kind", name="testapp_report_active_once"),
            unique_job_constraint("tenant", "hour", states=None, name="testapp_report_hourly"),
        ]


class VisibleJobManager(models.Manager["ManagedJob"]):
    """A default manager of the user's own: a plain ``QuerySet`` that hides some rows."""

    def get_queryset(self) -> models.QuerySet["ManagedJob"]:
        return super().get_queryset().filter(hidden=False)


class ManagedJob(WorkerJob):
    """A job table whose default manager is not ``WorkerJobQuerySet``'s, with a table
    and columns named its own way (quoted names, ``db_column``)."""

    hidden = models.BooleanField(default=False)
    state = models.CharField(
        max_length=16,
        choices=JobState.choices,
        default=JobState.QUEUED,
        db_default=JobState.QUEUED.value,
        db_index=True,
        db_column="Job State",
    )
    cancel = models.BooleanField(default=False, db_default=False, db_column="cancelRequested")

    objects = VisibleJobManager()  # type: ignore[assignment,misc]

    class Meta(WorkerJob.Meta):
        db_table = "testapp_Managed Job"


class Event(models.Model):
    """What handlers did, in order: hooks, attempts, outcomes (for assertions)."""

    job_id = models.BigIntegerField(db_index=True)
    kind = models.CharField(max_length=40)
    worker = models.CharField(max_length=255, default="")
    token = models.CharField(max_length=64, default="")
    at = models.FloatField(default=0.0)
    detail = models.TextField(default="", blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}"


def _new_token() -> str:
    return uuid.uuid4().hex


class UUIDJob(WorkerJob):
    """A job table keyed by UUID, with the defaults ordinary models have: ``auto_now_add``,
    a Python default and a database default (what ``bulk_enqueue`` must honour)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)  # type: ignore[assignment]
    behavior = models.CharField(max_length=40, default="ok")
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    token = models.CharField(max_length=32, default=_new_token)
    source = models.CharField(max_length=20, db_default="database")

    class Meta(WorkerJob.Meta):
        pass


class InitJob(QueueJob):
    """A job model that sets attributes in ``__init__`` and ``from_db``, as models do."""

    class Meta:
        proxy = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.built_by_init = True

    @classmethod
    def from_db(cls, db: Any, field_names: Any, values: Any, **kwargs: Any) -> Any:
        obj = super().from_db(db, field_names, values, **kwargs)
        obj.loaded_from = db  # type: ignore[attr-defined]
        return obj


class RepositoryIndexingJob(WorkerJob):
    """An ordinary model name whose ``testapp_repositoryindexingjob_dq`` is longer than
    Django's 30 characters: its inherited index names are shortened."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE)

    class Meta(WorkerJob.Meta):
        pass


class TenantJob(WorkerJob):
    """Jobs of tenants, for the fleet-wide limits per key (``concurrency_key``) and fair
    claims (``fair_by``)."""

    tenant = models.IntegerField(null=True, blank=True)
    behavior = models.CharField(max_length=40, default="ok")
    payload = models.JSONField(default=dict, blank=True)

    class Meta(WorkerJob.Meta):
        indexes = [*WorkerJob.Meta.indexes, fair_index("tenant", name="testapp_tenantjob_fair")]


class ScopedJob(WorkerJob):
    """Jobs of several tenants, for an admin that shows each user their tenant's jobs
    only (tests/test_admin_tenants.py): ``account`` is a concurrency key, ``queue`` a
    pausable queue."""

    tenant = models.CharField(max_length=40)
    account = models.CharField(max_length=60, default="")
    queue = models.CharField(max_length=40, default="default")
    #: A unique key shared by every tenant (an external resource's id).
    key = models.CharField(max_length=60, null=True, blank=True)  # noqa: DJ001 - NULL: no key

    class Meta(WorkerJob.Meta):
        indexes = [
            *WorkerJob.Meta.indexes,
            # What keeps a tenant's counts cheap at size (docs/admin.md § Tenants).
            models.Index(fields=["tenant", "state"], name="testapp_scopedjob_tenant"),
        ]
        constraints = [
            *WorkerJob.Meta.constraints,
            unique_job_constraint("key", name="testapp_scopedjob_key"),
        ]


class OrderEvent(models.Model):
    """An append-only table for consumers (tests/test_consumers.py, the chaos gap test)."""

    aggregate_type = models.CharField(max_length=40, default="Order")
    writer = models.IntegerField(default=0)
    payload = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.aggregate_type} event {self.pk}"


class SinkFence(models.Model):
    """A sink's fence for a consumer (tests/chaos/test_consumer_faults.py): the highest
    generation it has accepted writes from."""

    consumer = models.CharField(max_length=100, unique=True)
    generation = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.consumer} fenced at {self.generation}"


class Handled(models.Model):
    """What a test consumer handled (written in its batch's transaction)."""

    consumer = models.CharField(max_length=100)
    position = models.BigIntegerField()
    worker = models.CharField(max_length=255, default="")
    at = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"{self.consumer} handled {self.position}"


class Invoice(models.Model):
    """Another model's foreign keys to jobs, one per ``on_delete``: what retention must
    honour (``tests/test_controls.py``)."""

    report = models.ForeignKey(
        ReportJob, null=True, on_delete=models.CASCADE, related_name="invoices"
    )
    summary_of = models.ForeignKey(
        ReportJob, null=True, on_delete=models.SET_NULL, related_name="summaries"
    )
    protected = models.ForeignKey(
        ReportJob, null=True, on_delete=models.PROTECT, related_name="protected_by"
    )
    restricted = models.ForeignKey(
        ReportJob, null=True, on_delete=models.RESTRICT, related_name="restricted_by"
    )
    task = models.ForeignKey(
        "dbworker_tasks.TaskJob", null=True, on_delete=models.CASCADE, related_name="invoices"
    )

    def __str__(self) -> str:
        return f"invoice {self.pk}"


class PropertyJob(WorkerJob):
    """The job of the stateful property test (``tests/test_properties.py``): a unique
    ``key`` while active, a ``priority`` claims take first, a ``queue`` to pause."""

    key = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001 - NULL: no key
    #: A waiting-only key: held while queued or errored (a job coming back to waiting
    #: while another one holds it is superseded).
    wkey = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001 - NULL: no key
    priority = models.IntegerField(default=0)
    queue = models.CharField(max_length=40, default="default")

    class Meta(WorkerJob.Meta):
        indexes = [
            *WorkerJob.Meta.indexes,
            dequeue_index("-priority", "id", name="testapp_propjob_prio_dq"),
        ]
        constraints = [
            *WorkerJob.Meta.constraints,
            unique_job_constraint("key", name="testapp_propertyjob_active_key"),
            unique_job_constraint(
                "wkey", states=["queued", "errored"], name="testapp_propertyjob_waiting_key"
            ),
        ]


class WaitingKeyJob(WorkerJob):
    """Waiting-only unique keys (gocraft/work's unique jobs): ``name`` is held while
    queued only, ``target`` while queued or errored; ``tenant`` and ``kind`` while
    active (for the meeting of both with ``on_conflict="replace"``). ``behavior`` and
    ``payload`` as ``QueueJob``'s (``BehaviorHandler``)."""

    name = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001 - NULL: no key
    target = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001 - NULL: no key
    tenant = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001 - NULL: no key
    behavior = models.CharField(max_length=40, default="ok")
    payload = models.JSONField(default=dict, blank=True)

    class Meta(WorkerJob.Meta):
        constraints = [
            *WorkerJob.Meta.constraints,
            unique_job_constraint("name", states=["queued"], name="testapp_waitkey_queued"),
            unique_job_constraint(
                "target", states=["queued", "errored"], name="testapp_waitkey_waiting"
            ),
            unique_job_constraint("tenant", name="testapp_waitkey_active"),
        ]


class TextKeyJob(WorkerJob):
    """A job table keyed by text that a JSON path would misread (``"``, ``.``, ``$``,
    ``\\``, ``[0]``, unicode): check-ins and results must find their own row."""

    id = models.CharField(primary_key=True, max_length=100)  # type: ignore[assignment]
    result = models.JSONField(null=True, blank=True)
    #: A text field for the per-key limits: longer than a rate bucket's key can be.
    group = models.TextField(null=True, blank=True)  # noqa: DJ001 - NULL: no key

    class Meta(WorkerJob.Meta):
        pass


class PartJob(PartitionedWorkerJob):
    """A partitioned job table (``django_dbworker.partitions``, PostgreSQL): QueueJob's
    columns (the chaos scenario runs on it too) and a unique key over active jobs."""

    repository = models.ForeignKey(Repository, null=True, blank=True, on_delete=models.CASCADE)
    behavior = models.CharField(max_length=40, default="ok")
    payload = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    size = models.IntegerField(default=1)
    key = models.CharField(max_length=60, null=True, blank=True)  # noqa: DJ001 - NULL: no key

    class Meta(PartitionedWorkerJob.Meta):
        constraints = [
            *WorkerJob.Meta.constraints,
            unique_job_constraint("key", name="testapp_partjob_key"),
        ]


class LedgerJob(WorkerJob):
    """A job of the transactional handlers' tests (issue 44): each inserts a
    ``LedgerEntry`` and adds one to a ``LedgerCounter``."""

    behavior = models.CharField(max_length=40, default="ok")
    payload = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)

    class Meta(WorkerJob.Meta):
        pass


class LedgerEntry(models.Model):  # noqa: DJ008
    """The domain row a ledger job writes: no unique constraint, so a job whose work
    committed twice shows as two rows."""

    job_id = models.BigIntegerField(db_index=True)
    worker = models.CharField(max_length=255, default="")
    phase = models.CharField(max_length=40, default="")


class LedgerCounter(models.Model):  # noqa: DJ008
    name = models.CharField(max_length=40, unique=True)
    value = models.BigIntegerField(default=0)
