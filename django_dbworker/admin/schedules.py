"""The schedules in the admin: periodic schedules as the workers registered them from
the code, switched on and off with actions (the *change* permission on schedules),
each switch in the audit trail.

A schedule the code still declares cannot be deleted: a worker would register it again
at its next pass, switched on, undoing a switch-off without a trace. It is switched off
instead (and removed by removing it from the code). A schedule no worker declares any
more (its handler is gone, or no longer declares it) is deleted with the *delete*
permission, and the deletion is written to the audit trail.

The last job of a schedule (a job of any model) is linked, and its state shown, only to
a user who may view that job (``permissions.visible_jobs``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..control.models import Schedule
from ..control.schedules import delete_schedules, set_schedule_enabled
from ..known import configured_handlers, declared_schedules
from ..models import WorkerProcess
from ..text import EMPTY
from .databases import AcrossDatabases, DatabaseFilter
from .display import local_time
from .permissions import model_permission, operator_name, visible_jobs


def still_declared(rows: list[Schedule]) -> dict[str, str]:
    """Why each schedule of ``rows`` that some worker may still declare cannot be
    deleted (by name): declared by a handler the settings name (``DBWORKER["HANDLERS"]``,
    ``TASKS``), or its handler runs on a live worker and is not among those (the admin
    cannot read its declarations: it imports only what the settings name)."""
    handlers = configured_handlers()
    declared = declared_schedules(handlers)
    known = {handler.get_name() for handler in handlers}
    live = {
        str(name)
        for worker in WorkerProcess.objects.all()
        if worker.is_alive()
        for name in (worker.handlers if isinstance(worker.handlers, list) else [])
    }
    reasons = {}
    for row in rows:
        if row.name in declared:
            reasons[row.name] = (
                f"{row.name}: declared in code by {declared[row.name]}, a worker would "
                "register it again, switched on: switch it off instead (or remove it from "
                "the code, then delete it)"
            )
        elif row.target in live and row.target not in known:
            reasons[row.name] = (
                f"{row.name}: a live worker runs {row.target}, which may declare it (not in "
                "DBWORKER['HANDLERS']: the admin cannot read its schedules): switch it off "
                "instead, or delete it when no live worker runs that handler"
            )
    return reasons


@admin.register(Schedule)
class ScheduleAdmin(AcrossDatabases, admin.ModelAdmin):  # type: ignore[type-arg]
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
    list_filter = ("enabled", "target", DatabaseFilter)
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
        return False  # the form is read-only; the switch is an action (has_switch_...)

    def has_switch_permission(self, request: HttpRequest) -> bool:
        """Switching schedules on and off: the *change* permission on schedules."""
        return model_permission(request, Schedule, "change")

    # -- the last job, as the user may see it ----------------------------------------

    def _with_last_jobs(self, request: HttpRequest, rows: Any) -> None:
        labels = [row.last_job for row in rows if row.last_job]
        visible = visible_jobs(request, self.admin_site, labels)
        for row in rows:
            row._dbworker_last = (row.last_job in visible, visible.get(row.last_job))

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        self._with_last_jobs(request, changelist.result_list)
        return changelist

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            self._with_last_jobs(request, [obj])
        return obj

    @admin.display(description="last job")
    def last_job_link(self, obj: Schedule) -> SafeString | str:
        if not obj.last_job:
            return EMPTY
        _, job = getattr(obj, "_dbworker_last", (False, None))
        if job is None:
            return obj.last_job  # not a job the user may open: its label only
        return format_html('<a href="{}">{}</a>', job.url, obj.last_job)

    @admin.display(description="last outcome")
    def last_outcome(self, obj: Schedule) -> str:
        if not obj.last_job:
            return EMPTY
        known, job = getattr(obj, "_dbworker_last", (False, None))
        if job is not None:
            return str(job.state)
        return "not found (deleted?)" if known else EMPTY

    # -- columns ---------------------------------------------------------------------

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

    # -- actions ---------------------------------------------------------------------

    def _switch(self, request: HttpRequest, queryset: QuerySet[Schedule], on: bool) -> None:
        by = operator_name(request)
        done = [s.name for s in queryset if set_schedule_enabled(s.name, on, by=by, source="admin")]
        self.message_user(
            request, f"Switched {'on' if on else 'off'} {len(done)}: {', '.join(done) or EMPTY}."
        )

    @admin.action(description="Switch selected schedules on", permissions=["switch"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._switch(request, queryset, True)

    @admin.action(description="Switch selected schedules off", permissions=["switch"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._switch(request, queryset, False)

    # -- deleting: only what no worker declares, audited -----------------------------

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """What a delete would remove; the schedules a worker may still declare are
        listed as protected (with the reason), so Django refuses the delete."""
        deletable, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        kept = still_declared(list(objs))
        return deletable, counts, perms_needed, [*protected, *kept.values()]

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        self.delete_queryset(request, Schedule.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        rows = list(queryset)
        kept = still_declared(rows)  # again: a worker may have started since the page
        delete_schedules(
            [row.name for row in rows if row.name not in kept],
            by=operator_name(request),
            source="admin",
        )
        if kept:
            self.message_user(
                request, f"Not deleted: {'; '.join(kept.values())}.", messages.WARNING
            )
