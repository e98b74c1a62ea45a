from django.contrib import admin

from django_dbworker.admin import WorkerJobAdmin

from .models import ExampleJob, Repository


@admin.register(ExampleJob)
class ExampleJobAdmin(WorkerJobAdmin):
    list_display = WorkerJobAdmin.list_display + ("repository",)
    list_filter = WorkerJobAdmin.list_filter + ("repository",)
    list_select_related = ("repository",)


@admin.register(Repository)
class RepositoryAdmin(admin.ModelAdmin):
    list_display = ("name", "url")
