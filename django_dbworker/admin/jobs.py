"""``WorkerJobAdmin``: the admin of any job model, the operations console.

The list's filters live in ``filters``, how columns look in ``display``, and
the live-workers view in ``workers``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import figures
from ..control.limits import limited_handlers, limits_usage
from ..models import BOOKKEEPING_FIELDS
from ..states import JobState
from ..text import EMPTY, human_duration
from .actions import JOB_OPERATIONS, JobOperationsAdmin
from .charts import bar_chart
from .counts import EstimatingPaginator, state_counts
from .dashboard import dashboard
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
from .explain import explain
from .filters import (
    CancelRequestedFilter,
    DueFilter,
    StalledFilter,
    WorkerHostnameFilter,
)
from .history import attempts_table
from .scope import Visible
from .serving import Serving, serving

#: Seconds between two refreshes of the dashboard (``?refresh=0`` turns them off).
DASHBOARD_REFRESH = 15
#: The read-only panels of the job page (not columns of the model).
PANELS = ("live_status", "explanation", "attempt_history")


class JobChangeList(ChangeList):
    """The job list: its rows without their large columns (the admin's
    ``list_deferred``) unless a column of ``list_display`` names them."""

    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Any]:
        queryset = super().get_queryset(request, *args, **kwargs)
        shown = set(self.list_display)
        listed = getattr(self.model_admin, "list_deferred", ())
        deferred = [name for name in listed if name not in shown]
        return queryset.defer(*deferred) if deferred else queryset


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
        DueFilter,
        StalledFilter,
        CancelRequestedFilter,
        WorkerHostnameFilter,
    )
    search_fields = ("failure_message",)
    search_help_text = "Job id, or words of the failure message."
    # No date hierarchy: its first and last dates and its list of years, months and days
    # are read from the whole table (a scan at a million rows). Set it in your admin if
    # the table stays small.
    date_hierarchy = None
    ordering = ("-id",)
    list_per_page = 50
    # Counts of a large table are estimates (``counts``); never a second count of all.
    paginator = EstimatingPaginator
    show_full_result_count = False
    empty_value_display = EMPTY
    actions = (
        "cancel_jobs",
        "retry_jobs",
        "retry_jobs_reset_counters",
        "run_now",
        "schedule_jobs",
    )
    #: Columns the job list does not read unless a column of ``list_display`` names
    #: them: up to ``MAX_LOG_LENGTH`` characters of execution log and 50 attempts of
    #: history a row, which the list never shows.
    list_deferred: Any = ("execution_logs", "history")
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

    @admin.display(description="reasons")
    def explanation(self, obj: Any) -> SafeString | str:
        if obj is None or obj.pk is None:
            return self.get_empty_value_display()
        visible = getattr(obj, "_dbworker_visible", None) or Visible.only(obj)
        reasons = explain(obj, self.dbworker_serving(), visible=visible)
        return SafeString(
            render_to_string("django_dbworker/explanation.html", {"reasons": reasons})
        )  # the template autoescapes every value

    @admin.display(description="attempts")
    def attempt_history(self, obj: Any) -> SafeString | str:
        if obj is None or obj.pk is None:
            return self.get_empty_value_display()
        return attempts_table(obj, self.get_empty_value_display())

    # -- what the user may see ------------------------------------------------------

    def visible(self, request: HttpRequest) -> Visible:
        """The jobs ``request``'s user may see (``get_queryset``), and whether they are
        the whole table: every figure of the list, the dashboard and the job page is
        built from them (``scope``)."""
        return Visible.of(self.get_queryset(request))

    def dbworker_serving(self) -> Serving:
        """The handlers of this model, the worker registry and the pauses."""
        return serving(self.model)

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            obj._dbworker_visible = self.visible(request)  # for the job page's panels
        return obj

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: Any,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Any:
        if not issubclass(self.paginator, EstimatingPaginator):
            return super().get_paginator(
                request, queryset, per_page, orphans, allow_empty_first_page
            )
        return self.paginator(
            queryset,
            per_page,
            orphans,
            allow_empty_first_page,
            estimates=self.visible(request).whole,
        )

    # -- pages -----------------------------------------------------------------------

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (*super().get_readonly_fields(request, obj), *BOOKKEEPING_FIELDS, *PANELS)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.fieldsets:
            return self.fieldsets
        form_fields = [
            f
            for f in self.get_fields(request, obj)
            if f not in BOOKKEEPING_FIELDS and f not in PANELS
        ]
        job_fields = [
            f for f in BOOKKEEPING_FIELDS if f not in ("execution_logs", "failure_message")
        ]
        fieldsets: list[Any] = []
        if form_fields:
            fieldsets.append((None, {"fields": form_fields}))
        if obj is not None:
            fieldsets.append(("Status", {"fields": ["live_status"]}))
            fieldsets.append(("Why is this job not running?", {"fields": ["explanation"]}))
            fieldsets.append(("Attempts", {"fields": ["attempt_history"]}))
        fieldsets.append(
            ("Job", {"fields": job_fields, "classes": ["collapse"] if obj is not None else []})
        )
        return fieldsets

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def job_operation_view(
        self, request: HttpRequest, object_id: str, operation: str
    ) -> HttpResponse:
        """``log``: the whole execution log as JSON (the job page shows its last
        entries); the other operations are ``JobOperationsAdmin``'s."""
        if operation != "log":
            return super().job_operation_view(request, object_id, operation)
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404("no such job")
        if not self.has_view_or_change_permission(request, obj):
            raise PermissionDenied
        logs = obj.execution_logs if isinstance(obj.execution_logs, list) else []
        response = JsonResponse(logs, safe=False, json_dumps_params={"indent": 1})
        response["Content-Disposition"] = 'attachment; filename="execution-log.json"'
        return response

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        # A number is a job id when the primary key takes it (str.isdigit() also holds
        # for "²", and int() refuses more than 4,300 digits): else it is searched as words.
        if term.isascii() and term.isdigit():
            try:
                pk = self.model._meta.pk.to_python(term)
            except ValidationError:
                pass
            else:
                return queryset.filter(pk=pk), False
        return super().get_search_results(request, queryset, search_term)

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        dashboard_url = path(
            "dashboard/",
            self.admin_site.admin_view(self.dashboard_view),
            name=f"{opts.app_label}_{opts.model_name}_dashboard",
        )
        return [dashboard_url, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """Per handler what waits and runs, and what finished over the last hour and day."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        board = dashboard(self.model, self.dbworker_serving(), self.visible(request))
        refresh = request.GET.get("refresh") != "0"
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": f"Dashboard: {opts.verbose_name_plural}",
            "opts": opts,
            "board": board,
            "minutes_chart": bar_chart(
                board.minutes, "attempts per minute, last hour", "%H:%M", every=10
            ),
            "hours_chart": bar_chart(board.hours, "attempts per hour, last day", "%H:00", every=3),
            "refresh": DASHBOARD_REFRESH if refresh else None,
            "refresh_seconds": DASHBOARD_REFRESH,
            "changelist_url": reverse(
                f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"
            ),
            "media": self.media,
            **self._breadcrumbs((None, "Dashboard")),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_dbworker/dashboard.html", context)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied  # before anything is read
        visible = self.visible(request)
        counted = state_counts(visible)
        subset = None if visible.whole else visible.rows
        selected = request.GET.get("state__exact")
        opts = self.model._meta
        extra_context = {
            **(extra_context or {}),
            "dbworker_counts": [
                {
                    "state": state,
                    "badge": state_badge(state),
                    "count": counted.counts.get(state, 0),
                    "estimated": state in counted.estimated,
                    "at_least": state in counted.at_least,
                    "selected": state == selected,
                }
                for state in JobState.values
            ],
            "dbworker_total": counted.total,
            "dbworker_total_estimated": counted.total_estimated,
            "dbworker_total_at_least": counted.total_at_least,
            "dbworker_counts_limit": figures.EXACT_BELOW,
            "dbworker_dashboard_url": reverse(
                f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_dashboard"
            ),
            "dbworker_limits": [
                (handler.get_name(), usage.lines())
                for handler in limited_handlers()
                if handler.model is self.model
                and (usage := limits_usage(handler, subset)) is not None
            ],
        }
        return super().changelist_view(request, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        buttons = []
        obj = (
            self.get_object(request, unquote(object_id))
            if self.has_change_permission(request)
            else None
        )
        if obj is not None and self.has_change_permission(request, obj):
            buttons = [
                {"name": name, "label": JOB_OPERATIONS[name].label, "url": self._url(name, obj.pk)}
                for name in self._job_operations(obj)
            ]
        extra_context = {**(extra_context or {}), "dbworker_buttons": buttons}
        return super().change_view(request, object_id, form_url, extra_context)
