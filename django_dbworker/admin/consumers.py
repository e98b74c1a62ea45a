"""The consumers in the admin: state, checkpoint, lag and age against the table's head
(``consumers.status``), owner, the gap-skip audit; pause/resume and reset-checkpoint
(audited). Deleting a checkpoint is refused while a live worker declares the consumer
(it would silently stop it, then replay it from ``start_position``): only retired
consumers' rows are deleted (audited)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..consumers.models import ConsumerCheckpoint, ConsumerGapSkip
from ..consumers.operations import delete_retired, reset_checkpoint, set_paused
from ..consumers.status import ConsumerStatus, declared, statuses
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

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The page's rows with their status: one read of the registry, one of each
        consumed table's head."""
        changelist = super().get_changelist_instance(request)
        for found in statuses(changelist.result_list, changelist.queryset.db):
            found.row._dbworker_status = found  # type: ignore[attr-defined]
        return changelist

    @staticmethod
    def _status(obj: ConsumerCheckpoint) -> ConsumerStatus:
        found = getattr(obj, "_dbworker_status", None)
        return found if found is not None else statuses([obj], obj._state.db or "default")[0]

    @admin.display(description="state")
    def status(self, obj: ConsumerCheckpoint) -> str:
        state = self._status(obj).state
        return "FAILING" if state == "failing" else state

    @admin.display(description="lag (rows)")
    def lag_rows(self, obj: ConsumerCheckpoint) -> int:
        return self._status(obj).lag

    @admin.display(description="behind for")
    def lag_age(self, obj: ConsumerCheckpoint) -> str:
        return human_duration(self._status(obj).behind_for)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """What a delete would remove; the consumers a live worker declares are listed
        as protected, so the delete is refused with the reason."""
        deletable, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        rows = list(objs)
        alias = (rows[0]._state.db if rows else None) or "default"
        live = declared(alias, [row.name for row in rows])
        if live:
            protected = [
                *protected,
                *(
                    f"{name}: a live worker runs it (pause it, or reset its checkpoint; "
                    "delete it once no worker declares it)"
                    for name in sorted(live)
                ),
            ]
        return deletable, counts, perms_needed, protected

    def delete_model(self, request: HttpRequest, obj: ConsumerCheckpoint) -> None:
        self.delete_queryset(request, ConsumerCheckpoint.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ConsumerCheckpoint]) -> None:
        kept = delete_retired(queryset, _actor(request))
        if kept:
            self.message_user(
                request,
                f"Not deleted (a live worker runs them): {', '.join(kept)}.",
                messages.WARNING,
            )

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
