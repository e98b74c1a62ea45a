from django.contrib import admin

from django_dbworker.admin import WorkerJobAdmin

from .models import BenchJob


@admin.register(BenchJob)
class BenchJobAdmin(WorkerJobAdmin):
    list_display = WorkerJobAdmin.list_display + ("tenant",)
