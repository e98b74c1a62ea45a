"""The admin as the operations console: ``WorkerJobAdmin`` for job models and the
live-workers view (``WorkerProcess``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import widgets as admin_widgets
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Model, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from . import conf
from .admin_display import (
    first_line,
    heartbeat_age,
    human_duration,
    job_duration,
    live_panel,
    state_badge,
)
from .handler import Handler, HandlerImportError, import_handler, seconds
from .models import BOOKKEEPING_FIELDS, WorkerProcess
from .states import JobState


def stalled_max_age(model: type[Model]) -> float:
    """The smallest ``stalled_max_age`` of the configured handlers of ``model``."""
    ages = []
    for path_ in conf.get("HANDLERS"):
        try:
            handler = import_handler(path_)
        except HandlerImportError:
            continue
        if handler.model is model:
            ages.append(seconds(handler.stalled_max_age) or 0.0)
    return min(ages) if ages else seconds(Handler.stalled_max_age) or 30.0


class StalledFilter(admin.SimpleListFilter):
    title = "heartbeat"
    parameter_name = "heartbeat"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("stalled", "stalled (processing, old heartbeat)"), ("live", "live")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in ("stalled", "live"):
            return queryset
        cutoff = timezone.now() - timedelta(seconds=stalled_max_age(queryset.model))
        stale = Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=cutoff)
        processing = queryset.filter(state=JobState.PROCESSING)
        return processing.filter(stale) if self.value() == "stalled" else processing.exclude(stale)


class CancelRequestedFilter(admin.SimpleListFilter):
    title = "cancel requested"
    parameter_name = "cancel_requested"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "yes"), ("no", "no")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(cancel=self.value() == "yes")
        return queryset


class WorkerHostnameFilter(admin.SimpleListFilter):
    title = "worker"
    parameter_name = "worker"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = (
            model_admin.model._base_manager.exclude(worker_hostname="")
            .order_by()
            .values_list("worker_hostname", flat=True)
            .distinct()[:50]
        )
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(worker_hostname=self.value()) if self.value() else queryset


class ScheduleForm(forms.Form):
    process_after = forms.SplitDateTimeField(
        label="Run at",
        widget=admin_widgets.AdminSplitDateTime,
        help_text="In the site's time zone.",
    )


class WorkerJobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Admin for any ``WorkerJob`` subclass: state counts, actions, a live job page.

    Extend it like any ``ModelAdmin``:
    ``list_display = WorkerJobAdmin.list_display + ("repository",)``.
    """

    list_display: Any = (
        "id",
        "state_display",
        "attempts",
        "queued_at",
        "started_at",
        "finished_at",
        "duration",
        "heartbeat",
        "worker_hostname",
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
        if obj.cancel and obj.state == JobState.PROCESSING:
            return format_html(
                '{} <span class="dbworker-flag">cancel requested</span>', state_badge(obj.state)
            )
        return state_badge(obj.state)

    @admin.display(description="failures/resets")
    def attempts(self, obj: Any) -> str:
        return f"{obj.num_failures}/{obj.num_resets}"

    @admin.display(description="duration")
    def duration(self, obj: Any) -> str:
        return human_duration(job_duration(obj))

    @admin.display(description="heartbeat", ordering="last_heartbeat_at")
    def heartbeat(self, obj: Any) -> str:
        age = heartbeat_age(obj)
        return f"{human_duration(age)} ago" if age is not None else "–"

    @admin.display(description="failure")
    def failure(self, obj: Any) -> str:
        return first_line(obj.failure_message)

    @admin.display(description="live status")
    def live_status(self, obj: Any) -> SafeString:
        if obj is None or obj.pk is None:
            return SafeString("–")
        return live_panel(obj, self._url("live", obj.pk))

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
        }
        return super().changelist_view(request, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        obj = self.get_object(request, object_id)
        buttons = []
        if obj is not None and self.has_change_permission(request, obj):
            buttons = [
                {"label": label, "url": self._url(name, obj.pk)}
                for name, label in self._job_operations(obj)
            ]
        extra_context = {**(extra_context or {}), "dbworker_buttons": buttons}
        return super().change_view(request, object_id, form_url, extra_context)

    # -- single-job operations (buttons on the change page) --------------------------

    def _url(self, name: str, pk: Any) -> str:
        opts = self.model._meta
        return reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_dbworker", args=[pk, name]
        )

    @staticmethod
    def _job_operations(obj: Any) -> list[tuple[str, str]]:
        ops = []
        if obj.state in (JobState.QUEUED, JobState.ERRORED) or (
            obj.state == JobState.PROCESSING and not obj.cancel
        ):
            ops.append(("cancel", "Cancel"))
        if obj.state in (JobState.FAILED, JobState.ERRORED, JobState.CANCELED):
            ops.append(("retry", "Retry"))
            ops.append(("retry-reset", "Retry with fresh counters"))
        if (
            obj.state in (JobState.QUEUED, JobState.ERRORED)
            and obj.process_after
            and (obj.process_after > timezone.now())
        ):
            ops.append(("run-now", "Run now"))
        return ops

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        urls = [
            path(
                "<path:object_id>/dbworker/<str:operation>/",
                self.admin_site.admin_view(self.job_operation_view),
                name=f"{opts.app_label}_{opts.model_name}_dbworker",
            ),
        ]
        return urls + super().get_urls()

    def job_operation_view(
        self, request: HttpRequest, object_id: str, operation: str
    ) -> HttpResponse:
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404("no such job")
        if operation == "live":
            if not self.has_view_or_change_permission(request, obj):
                raise PermissionDenied
            return JsonResponse(
                {
                    "state": obj.state,
                    "processing": obj.state == JobState.PROCESSING,
                    "html": str(live_panel(obj, self._url("live", obj.pk))),
                }
            )
        return require_POST(self._operate)(request, obj, operation)

    def _operate(self, request: HttpRequest, obj: Any, operation: str) -> HttpResponse:
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        queryset = self.get_queryset(request).filter(pk=obj.pk)
        handlers = {
            "cancel": self.cancel_jobs,
            "retry": self.retry_jobs,
            "retry-reset": self.retry_jobs_reset_counters,
            "run-now": self.run_now,
        }
        if operation not in handlers:
            raise Http404("no such operation")
        handlers[operation](request, queryset)
        opts = self.model._meta
        return HttpResponseRedirect(
            reverse(
                f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]
            )
        )

    # -- actions ---------------------------------------------------------------------

    def _report(
        self, request: HttpRequest, done: str, total: int, acted: int, skipped_why: str
    ) -> None:
        skipped = total - acted
        text = done
        if skipped:
            text += f"; skipped {skipped} ({skipped_why})"
        self.message_user(request, text, messages.SUCCESS if acted else messages.WARNING)

    @admin.action(description="Cancel selected jobs", permissions=["change"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        total = queryset.count()
        canceled, requested = queryset.cancel()  # type: ignore[attr-defined]
        self._report(
            request,
            f"Canceled {canceled} job(s); asked the workers of {requested} running job(s) to "
            "stop them at their next heartbeat",
            total,
            canceled + requested,
            "already finished, or cancellation already requested",
        )

    @admin.action(description="Retry selected jobs (keep counters)", permissions=["change"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        total = queryset.count()
        done = queryset.retry()  # type: ignore[attr-defined]
        self._report(
            request,
            f"Queued {done} job(s) to run again now (failure and reset counts kept)",
            total,
            done,
            "only failed, errored and canceled jobs are retried",
        )

    @admin.action(description="Retry selected jobs with fresh counters", permissions=["change"])
    def retry_jobs_reset_counters(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        total = queryset.count()
        done = queryset.retry(reset_counters=True)  # type: ignore[attr-defined]
        self._report(
            request,
            f"Queued {done} job(s) to run again now with their full retry budget",
            total,
            done,
            "only failed, errored and canceled jobs are retried",
        )

    @admin.action(description="Run selected scheduled jobs now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        total = queryset.count()
        done = queryset.run_now()  # type: ignore[attr-defined]
        self._report(
            request,
            f"{done} job(s) can be claimed now",
            total,
            done,
            "only queued or errored jobs scheduled for later",
        )

    @admin.action(description="Schedule selected jobs at…", permissions=["change"])
    def schedule_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        form = ScheduleForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            total = queryset.count()
            when = form.cleaned_data["process_after"]
            done = queryset.schedule(when)  # type: ignore[attr-defined]
            self._report(
                request,
                f"{done} job(s) will not run before {when:%Y-%m-%d %H:%M %Z}",
                total,
                done,
                "only queued or errored jobs can be scheduled",
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Schedule jobs",
            "opts": self.model._meta,
            "form": form,
            "queryset": queryset,
            "count": queryset.count(),
            "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "media": self.media + form.media,
        }
        return TemplateResponse(request, "admin/django_dbworker/schedule.html", context)


@admin.register(WorkerProcess)
class WorkerProcessAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Live workers: who is running, what it holds, and who went silent."""

    list_display = (
        "worker_id",
        "status",
        "hostname",
        "pid",
        "handler_names",
        "num_handlers",
        "num_jobs",
        "heartbeat",
        "started_at",
    )
    list_filter = ("hostname",)
    search_fields = ("worker_id", "hostname")
    readonly_fields = (
        "worker_id",
        "status",
        "hostname",
        "pid",
        "handler_names",
        "num_handlers",
        "num_jobs",
        "jobs_in_flight",
        "heartbeat",
        "heartbeat_interval",
        "started_at",
        "last_heartbeat_at",
    )
    fields = readonly_fields
    ordering = ("hostname", "pid")

    class Media:
        css = {"all": ("django_dbworker/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="status")
    def status(self, obj: WorkerProcess) -> SafeString:
        if obj.is_alive():
            return format_html('<span class="dbworker-{}">{}</span>', "alive", "alive")
        return format_html('<span class="dbworker-{}">{}</span>', "dead", "silent (dead?)")

    @admin.display(description="last heartbeat", ordering="last_heartbeat_at")
    def heartbeat(self, obj: WorkerProcess) -> str:
        return f"{human_duration(obj.seconds_since_heartbeat())} ago"

    @admin.display(description="handlers")
    def handler_names(self, obj: WorkerProcess) -> str:
        return ", ".join(str(h) for h in obj.handlers) if isinstance(obj.handlers, list) else ""

    @admin.display(description="jobs in flight")
    def jobs_in_flight(self, obj: WorkerProcess) -> SafeString:
        links = []
        for label in obj.jobs if isinstance(obj.jobs, list) else []:
            links.append((self._job_url(str(label)), str(label)))
        if not links:
            return SafeString("–")
        return format_html_join(", ", '<a href="{}">{}</a>', links)

    def _job_url(self, label: str) -> str:
        from django.apps import apps

        model_label, _, pk = label.rpartition(":")
        try:
            model = apps.get_model(model_label)
            opts = model._meta
            return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[pk])
        except Exception:
            return "#"
