"""The operations of ``WorkerJobAdmin``: the job page's buttons with their confirmation
pages, and the list's actions, each performed as one guarded statement
(``django_dbworker.operations``), recorded in the jobs' history and reported."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import django
from django import forms
from django.contrib import admin, messages
from django.contrib.admin import widgets as admin_widgets
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import capfirst

from .. import operations
from ..states import JobState
from .display import failure_of_previous_attempt, first_line, live_panel, operation_effect

#: Django 6 renders breadcrumbs as a list (``<ol>``), 5.2 as a ``<div>``: our pages
#: follow the Django in use.
OL_BREADCRUMBS = django.VERSION >= (6, 0)

#: How a job's history (``LogEntry.change_message``) says where an operation came from.
VIA_ACTION = "dbworker action"
VIA_JOB_PAGE = "dbworker job page"


@dataclass(frozen=True)
class JobOperation:
    """An operation of the job page: its button, and its confirmation page's words."""

    label: str
    question: str  # the confirmation page's title; ``{pk}`` is the job's id
    confirm: str  # the confirmation page's submit button


#: The job page's operations, by the name in their URL, in the order of the buttons.
JOB_OPERATIONS = {
    "cancel": JobOperation("Cancel job", "Cancel job {pk}?", "Yes, cancel it"),
    "retry": JobOperation("Retry", "Retry job {pk}?", "Yes, retry it"),
    "retry-reset": JobOperation(
        "Retry with fresh counters",
        "Retry job {pk} with fresh counters?",
        "Yes, retry it with fresh counters",
    ),
    "run-now": JobOperation("Run now", "Run job {pk} now?", "Yes, run it now"),
}


class ScheduleForm(forms.Form):
    process_after = forms.SplitDateTimeField(
        label="Run at",
        widget=admin_widgets.AdminSplitDateTime,
        help_text="In the site's time zone.",
    )


class JobOperationsAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The operations of a job model's admin (``WorkerJobAdmin`` builds on it)."""

    # Columns WorkerJobAdmin defines, shown on the confirmation pages.
    state_display: Any
    attempts: Any

    # -- single-job operations (the job page's buttons and their confirmation pages) ---

    def _url(self, name: str, pk: Any) -> str:
        opts = self.model._meta
        return reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_dbworker",
            args=[quote(pk), name],
        )

    def _breadcrumbs(self, *tail: tuple[str | None, str]) -> dict[str, Any]:
        """Our pages' breadcrumbs: Home › app › job list › ``tail`` ((url, label) pairs)."""
        opts = self.model._meta
        site = self.admin_site.name
        return {
            "dbworker_ol_breadcrumbs": OL_BREADCRUMBS,
            "crumbs": [
                (
                    reverse(f"{site}:app_list", kwargs={"app_label": opts.app_label}),
                    opts.app_config.verbose_name,
                ),
                (
                    reverse(f"{site}:{opts.app_label}_{opts.model_name}_changelist"),
                    capfirst(opts.verbose_name_plural),
                ),
                *tail,
            ],
        }

    def _change_url(self, pk: Any) -> str:
        opts = self.model._meta
        return reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change", args=[quote(pk)]
        )

    @staticmethod
    def _job_operations(obj: Any) -> list[str]:
        """The names of the operations that apply to ``obj`` now."""
        return [name for name in JOB_OPERATIONS if operation_effect(name, obj)[0]]

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
        """``live``: the live panel as JSON. An operation: GET shows what it would do and
        asks to confirm; POST (with the CSRF token) performs it."""
        # The model's permission first, as Django's own views: a user without it gets
        # 403 whether or not the job exists (no answer tells them which ids do).
        live = operation == "live"
        allowed = self.has_view_or_change_permission if live else self.has_change_permission
        if not allowed(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404("no such job")
        if live:
            if not self.has_view_or_change_permission(request, obj):
                raise PermissionDenied
            return JsonResponse(
                {
                    "state": obj.state,
                    "processing": obj.state == JobState.PROCESSING,
                    "html": str(
                        live_panel(obj, self._url("live", obj.pk), self.get_empty_value_display())
                    ),
                }
            )
        if operation not in JOB_OPERATIONS:
            raise Http404("no such operation")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        if request.method == "POST":
            return self._operate(request, obj, operation)
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD", "POST"])
        return self._confirmation(request, obj, operation)

    def _confirmation(self, request: HttpRequest, obj: Any, operation: str) -> HttpResponse:
        spec = JOB_OPERATIONS[operation]
        applies, effect = operation_effect(operation, obj)
        context = {
            **self.admin_site.each_context(request),
            "title": spec.question.format(pk=obj.pk),
            "opts": self.model._meta,
            "object": obj,
            "operation": operation,
            "operation_label": spec.label,
            "confirm_label": spec.confirm,
            "applies": applies,
            "effect": effect,
            "state": self.state_display(obj),
            "attempts": self.attempts(obj),
            "failure": first_line(obj.failure_message),
            "previous_attempt": failure_of_previous_attempt(obj),
            "change_url": self._change_url(obj.pk),
            "media": self.media,
            **self._breadcrumbs((self._change_url(obj.pk), str(obj)), (None, spec.label)),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_dbworker/confirm_operation.html", context)

    def _operate(self, request: HttpRequest, obj: Any, operation: str) -> HttpResponse:
        queryset = self.get_queryset(request).filter(pk=obj.pk)
        if operation == "cancel":
            self.perform_cancel(request, queryset, VIA_JOB_PAGE)
        elif operation in ("retry", "retry-reset"):
            self.perform_retry(
                request, queryset, VIA_JOB_PAGE, reset_counters=operation == "retry-reset"
            )
        else:
            self.perform_run_now(request, queryset, VIA_JOB_PAGE)
        return HttpResponseRedirect(self._change_url(obj.pk))

    # -- operations: performed, recorded in the history, reported --------------------

    def log_operation(self, request: HttpRequest, pks: list[Any], message: str) -> None:
        """Record ``message`` in the history of each job of ``pks`` (a ``LogEntry``
        with the ``CHANGE`` flag, by the user of ``request``)."""
        user_id = request.user.pk
        assert user_id is not None  # the admin site's views need a logged-in user
        jobs = self.model._base_manager.defer("execution_logs")
        for start in range(0, len(pks), 500):
            LogEntry.objects.log_actions(
                user_id=user_id,
                queryset=jobs.filter(pk__in=pks[start : start + 500]),
                action_flag=CHANGE,
                change_message=message,
            )

    def _atomic(self) -> transaction.Atomic:
        """The operation and its history entries commit together."""
        return transaction.atomic(using=router.db_for_write(self.model))

    def _report(
        self, request: HttpRequest, done: str, total: int, acted: int, skipped_why: str
    ) -> None:
        skipped = total - acted
        text = done
        if skipped:
            text += f"; skipped {skipped} ({skipped_why})"
        self.message_user(request, text, messages.SUCCESS if acted else messages.WARNING)

    # Each runs one operation of ``django_dbworker.operations`` on the jobs of ``queryset``,
    # records it in the history of the jobs it changed, and tells the user what it did.
    # ``via`` says where it came from (``VIA_ACTION``, ``VIA_JOB_PAGE``).

    def perform_cancel(self, request: HttpRequest, queryset: QuerySet[Any], via: str) -> None:
        total = queryset.count()
        with self._atomic():
            result = operations.cancel(queryset)
            self.log_operation(request, result.canceled, f"Canceled ({via})")
            self.log_operation(request, result.requested, f"Cancellation requested ({via})")
        canceled, requested = len(result.canceled), len(result.requested)
        self._report(
            request,
            f"Canceled {canceled} job(s); asked the workers of {requested} running job(s) to "
            "stop them at their next heartbeat",
            total,
            canceled + requested,
            "already finished, or cancellation already requested",
        )

    def perform_retry(
        self, request: HttpRequest, queryset: QuerySet[Any], via: str, reset_counters: bool
    ) -> None:
        total = queryset.count()
        with self._atomic():
            result = operations.retry(queryset, reset_counters=reset_counters)
            how = "with fresh counters" if reset_counters else "counters kept"
            self.log_operation(request, result.retried, f"Retried, {how} ({via})")
        budget = (
            "with their full retry budget" if reset_counters else "(failure and reset counts kept)"
        )
        retried = len(result.retried)
        self._report(
            request,
            f"Queued {retried} job(s) to run again now {budget}",
            total - len(result.held),
            retried,
            "only failed, errored and canceled jobs are retried",
        )
        if result.held:
            holders = [pk for pk in result.held.values() if pk is not None]
            seen = set(
                self.get_queryset(request).filter(pk__in=holders).values_list("pk", flat=True)
            )
            text = held_keys(result.held, seen)
            self.message_user(request, f"Not retried: {text}.", messages.WARNING)

    def perform_run_now(self, request: HttpRequest, queryset: QuerySet[Any], via: str) -> None:
        total = queryset.count()
        with self._atomic():
            pks = operations.run_now(queryset)
            self.log_operation(request, pks, f"Run now ({via})")
        self._report(
            request,
            f"{len(pks)} job(s) can be claimed now",
            total,
            len(pks),
            "only queued or errored jobs scheduled for later",
        )

    def perform_schedule(
        self, request: HttpRequest, queryset: QuerySet[Any], via: str, when: datetime
    ) -> None:
        total = queryset.count()
        with self._atomic():
            pks = operations.schedule(queryset, when)
            self.log_operation(
                request, pks, f"Scheduled, not before {when:%Y-%m-%d %H:%M:%S %Z} ({via})"
            )
        self._report(
            request,
            f"{len(pks)} job(s) will not run before {when:%Y-%m-%d %H:%M %Z}",
            total,
            len(pks),
            "only queued or errored jobs can be scheduled",
        )

    # -- actions ---------------------------------------------------------------------

    @admin.action(description="Cancel selected jobs", permissions=["change"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.perform_cancel(request, queryset, VIA_ACTION)

    @admin.action(description="Retry selected jobs (keep counters)", permissions=["change"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.perform_retry(request, queryset, VIA_ACTION, reset_counters=False)

    @admin.action(description="Retry selected jobs with fresh counters", permissions=["change"])
    def retry_jobs_reset_counters(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.perform_retry(request, queryset, VIA_ACTION, reset_counters=True)

    @admin.action(description="Run selected scheduled jobs now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.perform_run_now(request, queryset, VIA_ACTION)

    @admin.action(description="Schedule selected jobs at…", permissions=["change"])
    def schedule_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        form = ScheduleForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            self.perform_schedule(request, queryset, VIA_ACTION, form.cleaned_data["process_after"])
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
            **self._breadcrumbs((None, "Schedule jobs")),
        }
        return TemplateResponse(request, "admin/django_dbworker/schedule.html", context)


def held_keys(held: dict[Any, Any], seen: Any = None, most: int = 10) -> str:
    """Jobs a retry left because their unique key is held, as an operator reads them;
    a holder not among ``seen`` (the jobs the user may see; None: all) is not named."""
    parts = [
        (
            f"job {pk} (its unique key is held by job {holder})"
            if seen is None or holder in seen
            else f"job {pk} (its unique key is held by a job you cannot see)"
        )
        if holder is not None
        else f"job {pk} (its unique key was held by a job that has finished since: retry it)"
        for pk, holder in list(held.items())[:most]
    ]
    more = len(held) - most
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")
