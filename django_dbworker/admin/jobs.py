"""``WorkerJobAdmin``: the admin of any job model, the operations console.

The list's filters live in ``filters``, how columns look in ``display``, and
the live-workers view in ``workers``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.db.models import Count, QuerySet
from django.http import (
    HttpRequest,
)
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..control.limits import limited_handlers, limits_usage
from ..models import BOOKKEEPING_FIELDS
from ..states import JobState
from ..text import EMPTY, human_duration
from .actions import JOB_OPERATIONS, JobOperationsAdmin
from .display import (
    breakable_worker,
    failure_of_previous_attempt,
    first_line,
    heartbeat_age,
    job_duration,
    live_panel,
    local_time,
    progress_bar,
    state_badge,
)
from .filters import (
    CancelRequestedFilter,
    StalledFilter,
    WorkerHostnameFilter,
)


class WorkerJobAdmin(JobOperationsAdmin):
    """Admin for any ``WorkerJob`` subclass: state counts, actions, a live job page.

    Extend it like any ``ModelAdmin``:
    ``list_display = WorkerJobAdmin.list_display + ("repository",)``.
    """

    list_display: Any = (
        "id",
        "state_display",
        "attempts",
        "queued",
        "started",
        "finished",
        "duration",
        "worker",
        "failure",
    )
    list_filter = (
        "state",
        StalledFilter,
        CancelRequestedFilter,
        WorkerHostnameFilter,
    )
    search_fields = ("failure_message",)
    search_help_text = "Job id, or words of the failure message."
    date_hierarchy = "queued_at"
    ordering = ("-id",)
    list_per_page = 50
    empty_value_display = EMPTY
    actions = (
        "cancel_jobs",
        "retry_jobs",
        "retry_jobs_reset_counters",
        "run_now",
        "schedule_jobs",
    )
    change_list_template = "admin/django_dbworker/change_list.html"
    change_form_template = "admin/django_dbworker/change_form.html"

    class Media:
        css = {"all": ("django_dbworker/admin.css",)}
        js = ("django_dbworker/live.js",)

    # -- columns ---------------------------------------------------------------------

    @admin.display(description="state", ordering="state")
    def state_display(self, obj: Any) -> SafeString:
        """The state's badge; for a running job also whether it was asked to stop and
        how long ago its worker last heartbeated."""
        parts = [state_badge(obj.state)]
        if obj.state == JobState.PROCESSING:
            if obj.cancel:
                parts.append(
                    format_html('<span class="dbworker-flag">{}</span>', "cancel requested")
                )
            bar = progress_bar(getattr(obj, "progress", None))
            if bar is not None:
                parts.append(bar)
            age = heartbeat_age(obj)
            if age is not None:
                parts.append(
                    format_html(
                        '<span class="dbworker-beat">heartbeat <span class="dbworker-nowrap">'
                        "{} ago</span></span>",
                        human_duration(age),
                    )
                )
        return format_html_join(" ", "{}", ((part,) for part in parts))

    @admin.display(description="failures / resets")
    def attempts(self, obj: Any) -> str:
        return f"{obj.num_failures}/{obj.num_resets}"

    @admin.display(description="queued", ordering="queued_at")
    def queued(self, obj: Any) -> SafeString | str:
        return local_time(obj.queued_at) or self.get_empty_value_display()

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: Any) -> SafeString | str:
        return local_time(obj.started_at) or self.get_empty_value_display()

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: Any) -> SafeString | str:
        return local_time(obj.finished_at) or self.get_empty_value_display()

    @admin.display(description="duration")
    def duration(self, obj: Any) -> str:
        return human_duration(job_duration(obj), self.get_empty_value_display())

    @admin.display(description="heartbeat", ordering="last_heartbeat_at")
    def heartbeat(self, obj: Any) -> str:
        age = heartbeat_age(obj)
        return f"{human_duration(age)} ago" if age is not None else self.get_empty_value_display()

    @admin.display(description="worker", ordering="worker_hostname")
    def worker(self, obj: Any) -> SafeString | str:
        if not obj.worker_hostname:
            return self.get_empty_value_display()
        return breakable_worker(obj.worker_hostname)

    @admin.display(description="failure")
    def failure(self, obj: Any) -> SafeString | str:
        line = first_line(obj.failure_message)
        if not line:
            return self.get_empty_value_display()
        if failure_of_previous_attempt(obj):
            return format_html('<span class="dbworker-previous">previous attempt:</span> {}', line)
        return line

    @admin.display(description="live status")
    def live_status(self, obj: Any) -> SafeString | str:
        if obj is None or obj.pk is None:
            return self.get_empty_value_display()
        return live_panel(obj, self._url("live", obj.pk), self.get_empty_value_display())

    # -- pages -----------------------------------------------------------------------

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (*super().get_readonly_fields(request, obj), *BOOKKEEPING_FIELDS, "live_status")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.fieldsets:
            return self.fieldsets
        form_fields = [
            f
            for f in self.get_fields(request, obj)
            if f not in BOOKKEEPING_FIELDS and f != "live_status"
        ]
        job_fields = [
            f for f in BOOKKEEPING_FIELDS if f not in ("execution_logs", "failure_message")
        ]
        fieldsets: list[Any] = []
        if form_fields:
            fieldsets.append((None, {"fields": form_fields}))
        if obj is not None:
            fieldsets.append(("Status", {"fields": ["live_status"]}))
        fieldsets.append(
            ("Job", {"fields": job_fields, "classes": ["collapse"] if obj is not None else []})
        )
        return fieldsets

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return super().get_search_results(request, queryset, search_term)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        counts = dict(
            self.model._base_manager.values_list("state").annotate(n=Count("pk")).order_by()
        )
        selected = request.GET.get("state__exact")
        extra_context = {
            **(extra_context or {}),
            "dbworker_counts": [
                {
                    "state": state,
                    "badge": state_badge(state),
                    "count": counts.get(state, 0),
                    "selected": state == selected,
                }
                for state in JobState.values
            ],
            "dbworker_total": sum(counts.values()),
            "dbworker_limits": [
                (handler.get_name(), usage.lines())
                for handler in limited_handlers()
                if handler.model is self.model and (usage := limits_usage(handler)) is not None
            ],
        }
        return super().changelist_view(request, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        obj = self.get_object(request, unquote(object_id))
        buttons = []
        if obj is not None and self.has_change_permission(request, obj):
            buttons = [
                {"name": name, "label": JOB_OPERATIONS[name].label, "url": self._url(name, obj.pk)}
                for name in self._job_operations(obj)
            ]
        extra_context = {**(extra_context or {}), "dbworker_buttons": buttons}
        return super().change_view(request, object_id, form_url, extra_context)
