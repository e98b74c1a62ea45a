"""The consumers in the admin: owner, checkpoint, lag, failing state, the gap-skip
audit; pause/resume and reset-checkpoint (audited)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from ..consumers.models import ConsumerCheckpoint, ConsumerGapSkip
from ..consumers.operations import reset_checkpoint, set_paused
from ..text import human_duration


def _actor(request: HttpRequest) -> str:
    return f"admin ({request.user.get_username()})"


class ResetForm(forms.Form):
    position = forms.IntegerField(min_value=0)


@admin.register(ConsumerCheckpoint)
class ConsumerCheckpointAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "name",
        "status",
        "position",
        "lag_rows",
        "lag_age",
        "last_batch_at",
        "owner",
        "running_by",
        "failures",
    ]
    list_filter = ["paused", "failing"]
    search_fields = ["name", "owner"]
    readonly_fields = [f.name for f in ConsumerCheckpoint._meta.fields]
    actions = ["pause", "resume", "reset"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="state")
    def status(self, obj: ConsumerCheckpoint) -> str:
        return "paused" if obj.paused else "FAILING" if obj.failing else "ok"

    @admin.display(description="lag (rows)")
    def lag_rows(self, obj: ConsumerCheckpoint) -> int:
        return obj.lag

    @admin.display(description="behind for")
    def lag_age(self, obj: ConsumerCheckpoint) -> str:
        return human_duration(obj.behind_for(timezone.now()))

    @admin.action(description="Pause the selected consumers", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[ConsumerCheckpoint]) -> None:
        count = set_paused(queryset, True, _actor(request))
        self.message_user(request, f"Paused {count} consumer(s).", messages.SUCCESS)

    @admin.action(description="Resume the selected consumers", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[ConsumerCheckpoint]) -> None:
        count = set_paused(queryset, False, _actor(request))
        self.message_user(request, f"Resumed {count} consumer(s).", messages.SUCCESS)

    @admin.action(
        description="Reset the checkpoint of the selected consumer", permissions=["change"]
    )
    def reset(
        self, request: HttpRequest, queryset: QuerySet[ConsumerCheckpoint]
    ) -> HttpResponse | None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one consumer.", messages.WARNING)
            return None
        row = queryset.get()
        form = ResetForm(request.POST if "position" in request.POST else None)
        if form.is_valid():
            position = form.cleaned_data["position"]
            old = reset_checkpoint(row.name, position, _actor(request), using=queryset.db)
            self.message_user(
                request, f"{row.name}: checkpoint {old} → {position}.", messages.SUCCESS
            )
            return None
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": f"Reset the checkpoint of {row.name}",
            "row": row,
            "form": form,
            "opts": self.model._meta,
            "action": "reset",
        }
        return TemplateResponse(request, "admin/django_dbworker/reset_checkpoint.html", context)


@admin.register(ConsumerGapSkip)
class ConsumerGapSkipAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["at", "consumer", "first_position", "last_position", "waited", "worker"]
    list_filter = ["consumer"]
    readonly_fields = [f.name for f in ConsumerGapSkip._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
