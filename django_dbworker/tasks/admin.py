"""The admin of task results: ``WorkerJobAdmin`` with the task's own columns."""

from __future__ import annotations

import json
import uuid
from typing import Any, ClassVar

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..admin import WorkerJobAdmin
from ..admin.serving import Serving
from .models import TaskJob
from .serving import task_serving_handlers

#: Fields shown read-only on a task's page (a task is enqueued from code).
TASK_FIELDS = (
    "task_result_id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "run_after",
    "enqueued_at",
    "options",
)


def as_json(value: Any) -> SafeString:
    """A JSON value, pretty and escaped, in a <pre>."""
    return format_html("<pre class='dbworker-json'>{}</pre>", json.dumps(value, indent=2))


@admin.register(TaskJob)
class TaskJobAdmin(WorkerJobAdmin):
    """Task results: which task, its arguments, what it returned, each attempt's error;
    the same cancel, retry and inspect operations as any job."""

    list_display: Any = (
        "id",
        "task_path",
        "queue_name",
        "priority",
        "state_display",
        "attempts",
        "queued",
        "finished",
        "duration",
        "failure",
    )
    list_filter: ClassVar[Any] = ("state", "backend", "queue_name", *WorkerJobAdmin.list_filter[1:])
    #: Arguments, return values and each attempt's traceback: read on the task's page only.
    list_deferred: Any = (
        *WorkerJobAdmin.list_deferred,
        "args",
        "kwargs",
        "return_value",
        "errors",
        "worker_ids",
        "options",
    )
    search_fields: ClassVar[Any] = ("task_path", "failure_message")
    search_help_text = "Job number, result id, task path, or words of the failure message."

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        try:
            key = uuid.UUID(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(result_id=key), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tasks are enqueued from code

    def dbworker_serving(self) -> Serving:
        """The task handlers ``runworker --tasks`` runs (and those of the queues the
        registry's workers serve), beside any handler of the model the settings name."""
        found = super().dbworker_serving()
        known = {h.get_name() for h in found.handlers}
        found.handlers += [
            h for h in task_serving_handlers(found.workers) if h.get_name() not in known
        ]
        return found

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (
            *super().get_readonly_fields(request, obj),
            *TASK_FIELDS,
            "arguments",
            "returned",
            "errors_per_attempt",
            "workers",
        )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        status = [fieldset for fieldset in super().get_fieldsets(request, obj) if fieldset[0]]
        return [
            ("Task", {"fields": [*TASK_FIELDS, "arguments"]}),
            ("Result", {"fields": ["returned", "errors_per_attempt", "workers"]}),
            *status,
        ]

    @admin.display(description="result id")
    def task_result_id(self, obj: TaskJob) -> str:
        return obj.result_id.hex  # as TaskResult.id gives it (and Django's task logs)

    @admin.display(description="arguments")
    def arguments(self, obj: TaskJob) -> SafeString:
        return as_json({"args": obj.args, "kwargs": obj.kwargs})

    @admin.display(description="return value")
    def returned(self, obj: TaskJob) -> SafeString | str:
        if obj.state != "completed":
            return self.get_empty_value_display()
        return as_json(obj.return_value)

    @admin.display(description="errors, per attempt")
    def errors_per_attempt(self, obj: TaskJob) -> SafeString | str:
        errors = [e for e in (obj.errors or []) if isinstance(e, dict)]
        if not errors:
            return self.get_empty_value_display()
        return format_html_join(
            "",
            "<details class='dbworker-error'><summary>attempt {}: {} ({})</summary>"
            "<pre>{}</pre></details>",
            (
                (
                    number,
                    str(error.get("exception_class_path", "")),
                    str(error.get("message", "")),
                    str(error.get("traceback", "")),
                )
                for number, error in enumerate(errors, 1)
            ),
        )

    @admin.display(description="workers, per attempt")
    def workers(self, obj: TaskJob) -> str:
        return ", ".join(str(w) for w in (obj.worker_ids or [])) or self.get_empty_value_display()
