"""The tables of the controls: pauses, schedules and their ticks, the audit trail."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from ..conf import require_app

require_app()


class Pause(models.Model):
    """A paused handler or task queue: no worker claims its jobs while the row exists.

    ``name`` is a handler's name (``Handler.get_name()``) or ``tasks:<backend>:<queue>``.
    """

    name = models.CharField(max_length=255, unique=True)
    paused_at = models.DateTimeField(default=timezone.now)
    paused_by = models.CharField(max_length=255, blank=True, default="")
    reason = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        verbose_name = "paused handler"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Schedule(models.Model):
    """The state of one periodic schedule (declared in code, see ``Periodic``): whether
    it is enabled, and the last tick a worker enqueued."""

    name = models.CharField(max_length=255, unique=True)
    enabled = models.BooleanField(default=True)
    expression = models.CharField(max_length=255, help_text="As the code declares it.")
    timezone = models.CharField(max_length=64, default="UTC")
    target = models.CharField(max_length=255, help_text="The handler or task it enqueues.")
    last_tick = models.DateTimeField(null=True, blank=True, help_text="Last tick enqueued.")
    next_tick = models.DateTimeField(null=True, blank=True)
    last_job = models.CharField(max_length=255, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)
    declared_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the worker process that declared the expression, time zone and "
        "target started (the database's clock): a process started earlier with another "
        "declaration leaves the schedule alone (a rolling deploy).",
    )
    skipped_ticks = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Ticks not enqueued because the job's unique key was held (a run of the "
        "schedule still going).",
    )
    last_skipped_tick = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ScheduleTick(models.Model):
    """One tick of a schedule, enqueued: committed with the job it made, and unique per
    (schedule, tick), so a second enqueuer of the same tick fails and rolls back."""

    schedule = models.CharField(max_length=255)
    tick = models.DateTimeField()
    enqueued_at = models.DateTimeField(default=timezone.now)
    job = models.CharField(max_length=255, blank=True, default="")
    worker = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["schedule", "tick"], name="dbworker_tick_once")
        ]
        ordering = ["-tick"]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.tick.isoformat()}"


class AuditEntry(models.Model):
    """What an operator changed (pause, resume, a schedule switched on or off): when, who
    and from where (admin, command, code)."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=255, blank=True, default="")
    action = models.CharField(max_length=32)
    target = models.CharField(max_length=255)
    detail = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit trail"
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor or '?'}: {self.action} {self.target}"

    @classmethod
    def record(cls, alias: str, actor: str, action: str, target: str, detail: str) -> None:
        cls.objects.using(alias).create(
            actor=actor[:255], action=action, target=target[:255], detail=detail[:255]
        )


class RateBucket(models.Model):
    """The token bucket of a handler's rate limit (``key`` empty), or of one key of its
    per-key rate limit. Times are seconds since the epoch on the database's clock
    (PostgreSQL) or the workers' (SQLite). A bucket that would be full again is the same
    as no row: workers delete those. Names and keys compare byte for byte: on MariaDB
    both columns are ``utf8mb4_nopad_bin`` (migration 0012; an ``AlterField`` of them
    must keep it)."""

    name = models.CharField(max_length=255)
    key = models.CharField(max_length=255, blank=True, default="")
    tokens = models.FloatField(help_text="Tokens left at `at`.")
    at = models.FloatField(help_text="When `tokens` was computed (epoch seconds).")
    full_at = models.FloatField(help_text="When the bucket is full again (epoch seconds).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "key"], name="dbworker_bucket_once")]

    def __str__(self) -> str:
        return f"{self.name}[{self.key}]" if self.key else self.name
