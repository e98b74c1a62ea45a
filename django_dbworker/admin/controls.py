"""The controls in the admin: paused handlers and queues (pause with the add button,
resume with an action), periodic schedules (switched on and off with actions), and the
audit trail of both. Every change goes through ``django_dbworker.control`` and is
written to the audit trail with the operator's name."""

from __future__ import annotations

from typing import Any

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..control.models import AuditEntry, Pause, Schedule
from ..control.pause import pause, pause_names, resume
from ..control.schedules import set_schedule_enabled
from ..known import pausable_handlers, pause_problem, running_handler_names
from ..text import EMPTY
from .display import job_url, local_time


def _operator(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return str(user.get_username()) if user is not None else ""


class SuggestingInput(forms.TextInput):
    """A text input with a list of suggestions (any other value may be typed)."""

    def __init__(self, suggestions: list[str]) -> None:
        super().__init__(attrs={"list": "dbworker-suggestions", "autocomplete": "off"})
        self.suggestions = suggestions

    def render(self, *args: Any, **kwargs: Any) -> SafeString:
        options = format_html_join("", '<option value="{}">', ((s,) for s in self.suggestions))
        datalist = format_html('<datalist id="dbworker-suggestions">{}</datalist>', options)
        return format_html("{}{}", super().render(*args, **kwargs), datalist)


class PauseForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Pause
        fields = ("name", "reason")
        help_texts = {
            "name": "A handler's name as the live workers list it (suggested), "
            "&lt;handler&gt;:&lt;queue&gt; for one queue of a handler with a queue_field, "
            "or tasks:&lt;backend&gt;:&lt;queue&gt;.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handlers = pausable_handlers()
        # The handler names workers report: labels to pause by, never imported.
        known = sorted({*pause_names(self._handlers), *running_handler_names()})
        self.fields["name"].widget = SuggestingInput(known)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        problem = pause_problem(name, self._handlers)
        if problem:
            raise forms.ValidationError(
                f"{problem} (manage.py dbworker pause --force pauses a name no worker has yet)"
            )
        return name


@admin.register(Pause)
class PauseAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Paused handlers and queues: "Add" pauses one, the action resumes."""

    form = PauseForm
    list_display = ("name", "since", "paused_by", "reason")
    actions = ["resume_selected"]
    empty_value_display = EMPTY

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # resuming is the action, which audits it (and no "Delete selected")

    @admin.display(description="paused since", ordering="paused_at")
    def since(self, obj: Pause) -> SafeString | str:
        return local_time(obj.paused_at) or EMPTY

    def save_model(self, request: HttpRequest, obj: Pause, form: Any, change: bool) -> None:
        if not pause(obj.name, by=_operator(request), reason=obj.reason, source="admin"):
            self.message_user(request, f"{obj.name} was paused already.", messages.WARNING)
        obj.pk = Pause.objects.filter(name=obj.name).values_list("pk", flat=True).first()

    @admin.action(description="Resume selected (claim their jobs again)")
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Pause]) -> None:
        names = [p.name for p in queryset]
        done = [n for n in names if resume(n, by=_operator(request), source="admin")]
        self.message_user(request, f"Resumed {len(done)}: {', '.join(done) or EMPTY}.")


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Periodic schedules as the workers registered them from the code."""

    list_display = (
        "name",
        "switch",
        "expression",
        "timezone",
        "next_run",
        "last_run",
        "last_job_link",
        "last_outcome",
        "skipped",
    )
    list_filter = ("enabled", "target")
    search_fields = ("name", "target")
    readonly_fields = (
        "name",
        "enabled",
        "expression",
        "timezone",
        "target",
        "next_tick",
        "last_tick",
        "last_job_link",
        "last_outcome",
        "skipped",
        "declared_at",
        "updated_at",
    )
    fields = readonly_fields
    actions = ["enable_selected", "disable_selected"]
    empty_value_display = EMPTY

    class Media:
        css = {"all": ("django_dbworker/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # schedules are declared in code

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="enabled", ordering="enabled")
    def switch(self, obj: Schedule) -> SafeString:
        state = "on" if obj.enabled else "off"
        return format_html('<span class="dbworker-switch-{}">{}</span>', state, state)

    @admin.display(description="next run", ordering="next_tick")
    def next_run(self, obj: Schedule) -> SafeString | str:
        return (local_time(obj.next_tick) if obj.enabled else None) or EMPTY

    @admin.display(description="skipped ticks", ordering="skipped_ticks")
    def skipped(self, obj: Schedule) -> SafeString | str:
        """Ticks skipped because the job's unique key was held, and the last one."""
        if not obj.skipped_ticks:
            return "0"
        return format_html(
            "{} (last {})", obj.skipped_ticks, local_time(obj.last_skipped_tick) or EMPTY
        )

    @admin.display(description="last run", ordering="last_tick")
    def last_run(self, obj: Schedule) -> SafeString | str:
        return local_time(obj.last_tick) or EMPTY

    @admin.display(description="last job")
    def last_job_link(self, obj: Schedule) -> SafeString | str:
        if not obj.last_job:
            return EMPTY
        return format_html(
            '<a href="{}">{}</a>', job_url(self.admin_site.name, obj.last_job), obj.last_job
        )

    @admin.display(description="last outcome")
    def last_outcome(self, obj: Schedule) -> str:
        model_label, _, pk = obj.last_job.rpartition(":")
        try:
            model = apps.get_model(model_label)
            state = model._base_manager.filter(pk=pk).values_list("state", flat=True).first()
        except (LookupError, ValueError):
            return EMPTY
        return str(state) if state else "deleted"

    def _switch(self, request: HttpRequest, queryset: QuerySet[Schedule], on: bool) -> None:
        by = _operator(request)
        done = [s.name for s in queryset if set_schedule_enabled(s.name, on, by=by, source="admin")]
        self.message_user(
            request, f"Switched {'on' if on else 'off'} {len(done)}: {', '.join(done) or EMPTY}."
        )

    @admin.action(description="Switch selected schedules on")
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._switch(request, queryset, True)

    @admin.action(description="Switch selected schedules off")
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._switch(request, queryset, False)


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Who paused, resumed or switched what, when and from where. Read-only."""

    list_display = ("at", "actor", "action", "target", "detail")
    list_filter = ("action",)
    search_fields = ("actor", "target")
    actions = None
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
