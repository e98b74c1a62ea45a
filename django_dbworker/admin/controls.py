"""The controls in the admin: paused handlers and queues (pause with the add button and
the *add* permission, resume with an action and the *change* permission), and the
audit trail (read-only). The schedules are in ``schedules``. Every change goes through
``django_dbworker.control`` and is written to the audit trail with the operator's
name."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..control.models import AuditEntry, Pause
from ..control.pause import pause, pause_names, resume
from ..databases import everywhere
from ..known import pausable_handlers, pause_problem, running_handler_names
from ..text import EMPTY
from .databases import AcrossDatabases, DatabaseFilter
from .display import local_time
from .permissions import model_permission, operator_name
from .schedules import ScheduleAdmin

__all__ = ["AuditEntryAdmin", "PauseAdmin", "PauseForm", "ScheduleAdmin"]


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
class PauseAdmin(AcrossDatabases, admin.ModelAdmin):  # type: ignore[type-arg]
    """Paused handlers and queues: "Add" pauses one, the action resumes."""

    form = PauseForm
    list_display = ("name", "since", "paused_by", "reason")
    list_filter = (DatabaseFilter,)
    actions = ["resume_selected"]
    empty_value_display = EMPTY

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a pause is not edited; resuming is the action (has_resume_...)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # resuming is the action, which audits it (and no "Delete selected")

    def has_resume_permission(self, request: HttpRequest) -> bool:
        """Resuming: the *change* permission on pauses."""
        return model_permission(request, Pause, "change")

    @admin.display(description="paused since", ordering="paused_at")
    def since(self, obj: Pause) -> SafeString | str:
        return local_time(obj.paused_at) or EMPTY

    def save_model(self, request: HttpRequest, obj: Pause, form: Any, change: bool) -> None:
        if not pause(obj.name, by=operator_name(request), reason=obj.reason, source="admin"):
            self.message_user(request, f"{obj.name} was paused already.", messages.WARNING)
        obj.pk = next(  # written beside the jobs it holds (django_dbworker.databases)
            (p for a in everywhere(Pause) for p in Pause.objects.using(a).filter(name=obj.name)),
            obj,
        ).pk

    @admin.action(description="Resume selected (claim their jobs again)", permissions=["resume"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Pause]) -> None:
        names = [p.name for p in queryset]
        done = [n for n in names if resume(n, by=operator_name(request), source="admin")]
        self.message_user(request, f"Resumed {len(done)}: {', '.join(done) or EMPTY}.")


@admin.register(AuditEntry)
class AuditEntryAdmin(AcrossDatabases, admin.ModelAdmin):  # type: ignore[type-arg]
    """Who paused, resumed or switched what, when and from where. Read-only."""

    list_display = ("at", "actor", "action", "target", "detail")
    list_filter = ("action", DatabaseFilter)
    search_fields = ("actor", "target")
    actions = None
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
