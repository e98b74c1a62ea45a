"""The live-workers view: ``WorkerProcess`` rows as the ``runworker`` processes report
themselves. Read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..models import WorkerProcess
from ..runtime.pool import pool_lines
from ..text import EMPTY, human_duration
from .databases import AcrossDatabases, DatabaseFilter
from .display import local_time, progress_bar
from .permissions import visible_jobs


@admin.register(WorkerProcess)
class WorkerProcessAdmin(AcrossDatabases, admin.ModelAdmin):  # type: ignore[type-arg]
    """Live workers: who is running, what it holds, and who went silent."""

    list_display = (
        "worker_id",
        "status",
        "hostname",
        "pid",
        "handler_names",
        "num_handlers",
        "num_jobs",
        "num_connections",
        "pool_summary",
        "heartbeat",
        "started",
    )
    list_filter = ("hostname", DatabaseFilter)
    search_fields = ("worker_id", "hostname")
    readonly_fields = (
        "worker_id",
        "status",
        "hostname",
        "pid",
        "handler_names",
        "num_handlers",
        "num_jobs",
        "num_connections",
        "pool_figures",
        "jobs_in_flight",
        "heartbeat",
        "heartbeat_interval",
        "started_at",
        "last_heartbeat_at",
    )
    fields = readonly_fields
    ordering = ("hostname", "pid")
    actions = None  # read-only: no "Delete selected"
    empty_value_display = EMPTY

    class Media:
        css = {"all": ("django_dbworker/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Workers remove their own row; the resetter removes those of dead workers.
        return False

    @admin.display(description="status")
    def status(self, obj: WorkerProcess) -> SafeString:
        if obj.is_alive():
            return format_html('<span class="dbworker-{}">{}</span>', "alive", "alive")
        return format_html('<span class="dbworker-{}">{}</span>', "dead", "silent (dead?)")

    @admin.display(description="last heartbeat", ordering="last_heartbeat_at")
    def heartbeat(self, obj: WorkerProcess) -> str:
        return f"{human_duration(obj.seconds_since_heartbeat())} ago"

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: WorkerProcess) -> SafeString | str:
        return local_time(obj.started_at) or self.get_empty_value_display()

    @admin.display(description="shared pool")
    def pool_summary(self, obj: WorkerProcess) -> str:
        """``runworker --pool``: its busy slots of its size."""
        report = obj.pool if isinstance(obj.pool, dict) else None
        if report is None:
            return self.get_empty_value_display()
        return f"{report.get('busy')} of {report.get('size')} busy"

    @admin.display(description="shared pool")
    def pool_figures(self, obj: WorkerProcess) -> SafeString | str:
        """The pool's occupancy, and each handler's weight, share and busy slots."""
        lines = pool_lines(obj.pool)
        if not lines:
            return self.get_empty_value_display()
        return format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines))

    @admin.display(description="handlers")
    def handler_names(self, obj: WorkerProcess) -> str:
        names = obj.handlers if isinstance(obj.handlers, list) else []
        return ", ".join(str(h) for h in names) or self.get_empty_value_display()

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The worker, with the jobs it holds that the user may open (``visible_jobs``:
        of the models they may view, among the rows their job admin gives them)."""
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            obj._dbworker_visible = visible_jobs(request, self.admin_site, _labels(obj))
        return obj

    @admin.display(description="jobs in flight")
    def jobs_in_flight(self, obj: WorkerProcess) -> SafeString | str:
        """Each job the user may open, linked, with its last check-in; how many others
        it holds (of models or rows the user may not see: neither named nor read)."""
        labels = _labels(obj)
        if not labels:
            return self.get_empty_value_display()
        visible = getattr(obj, "_dbworker_visible", {})
        shown = [
            (job.url, label, progress_bar(job.progress) or "")
            for label in labels
            if (job := visible.get(label))
        ]
        parts = (
            [format_html_join(mark_safe("<br>"), '<a href="{}">{}</a> {}', shown)] if shown else []
        )
        hidden = len(labels) - len(shown)
        if hidden:
            parts.append(
                format_html(
                    '<span class="dbworker-hidden">{} job(s) you may not view</span>', hidden
                )
            )
        return format_html_join(mark_safe("<br>"), "{}", ((part,) for part in parts))


def _labels(obj: WorkerProcess) -> list[str]:
    """The jobs ``obj`` holds, as ``app_label.Model:pk``."""
    return [str(label) for label in (obj.jobs if isinstance(obj.jobs, list) else [])]
