from django.contrib import admin

from django_dbworker.admin import WorkerJobAdmin

from .models import ManagedJob, PartJob, QueueJob, ReportJob, ScopedJob, WaitingKeyJob


@admin.register(QueueJob)
class QueueJobAdmin(WorkerJobAdmin):
    list_display = WorkerJobAdmin.list_display + ("behavior",)


@admin.register(ManagedJob)
class ManagedJobAdmin(WorkerJobAdmin):
    pass


@admin.register(ReportJob)
class ReportJobAdmin(WorkerJobAdmin):
    pass


@admin.register(WaitingKeyJob)
class WaitingKeyJobAdmin(WorkerJobAdmin):
    pass


#: A user sees the jobs of the tenants named by their groups ``tenant:<name>``.
TENANT_GROUP = "tenant:"


def tenants_of(user):
    return [
        name[len(TENANT_GROUP) :]
        for name in user.groups.values_list("name", flat=True)
        if name.startswith(TENANT_GROUP)
    ]


@admin.register(ScopedJob)
class ScopedJobAdmin(WorkerJobAdmin):
    """The console of a service whose staff each look after one tenant (docs/admin.md §
    Tenants): superusers see every job, others their tenants' only."""

    list_display = WorkerJobAdmin.list_display + ("tenant", "account")

    def get_queryset(self, request):
        jobs = super().get_queryset(request)
        if request.user.is_superuser:
            return jobs
        return jobs.filter(tenant__in=tenants_of(request.user))


@admin.register(PartJob)
class PartJobAdmin(WorkerJobAdmin):
    """The partitioned job table's (tests/test_partitions.py)."""

    list_display = WorkerJobAdmin.list_display + ("behavior",)
