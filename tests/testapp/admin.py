from django.contrib import admin

from django_dbworker.admin import WorkerJobAdmin

from .models import ManagedJob, QueueJob, ReportJob


@admin.register(QueueJob)
class QueueJobAdmin(WorkerJobAdmin):
    list_display = WorkerJobAdmin.list_display + ("behavior",)


@admin.register(ManagedJob)
class ManagedJobAdmin(WorkerJobAdmin):
    pass


@admin.register(ReportJob)
class ReportJobAdmin(WorkerJobAdmin):
    pass
