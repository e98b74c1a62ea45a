"""Middleware the tests install (module level, so settings can name them)."""

import asyncio

from .models import Event


def recording(name):
    """A factory of middleware that records ``<name>:before`` / ``:after`` / ``:raised``."""

    def factory(next_call):
        def middleware(job, attempt):
            Event.objects.create(job_id=job.pk, kind=f"{name}:before", worker=attempt.worker_id)
            try:
                result = next_call(job, attempt)
            except BaseException as exc:
                Event.objects.create(job_id=job.pk, kind=f"{name}:raised:{type(exc).__name__}")
                raise
            Event.objects.create(job_id=job.pk, kind=f"{name}:after")
            return result

        return middleware

    return factory


outer = recording("outer")
inner = recording("inner")


def gate(next_call):
    """Skips jobs whose behavior is "skip", refuses those whose behavior is "refuse"."""

    def middleware(job, attempt):
        if job.behavior == "skip":
            return None
        if job.behavior == "refuse":
            raise PermissionError("tenant over quota")
        return next_call(job, attempt)

    return middleware


def async_recording(name):
    """``recording`` as Django-style async-capable middleware: async next, async callable
    for async handlers; a plain callable for the others."""

    def factory(next_call):
        if not asyncio.iscoroutinefunction(next_call):
            return recording(name)(next_call)

        async def middleware(job, attempt):
            await Event.objects.acreate(
                job_id=job.pk, kind=f"{name}:before", worker=attempt.worker_id
            )
            try:
                result = await next_call(job, attempt)
            except BaseException as exc:
                await Event.objects.acreate(
                    job_id=job.pk, kind=f"{name}:raised:{type(exc).__name__}"
                )
                raise
            await Event.objects.acreate(job_id=job.pk, kind=f"{name}:after")
            return result

        return middleware

    factory.async_capable = True
    return factory


async_outer = async_recording("async_outer")


class Phased:
    """Phase middleware (issue 44): hands the handler a tenant, records each phase, and
    writes an audit event inside the completion's transaction."""

    def wrap_prepare(self, next_call):
        def middleware(job, attempt):
            attempt.context["tenant"] = f"tenant-{job.pk}"
            Event.objects.create(job_id=job.pk, kind="phase:prepare")
            return next_call(job, attempt)

        return middleware

    def wrap_handle(self, next_call):
        def middleware(job, attempt):
            Event.objects.create(job_id=job.pk, kind="phase:handle")
            return next_call(job, attempt)

        return middleware

    def wrap_complete(self, next_call):
        def middleware(job, attempt):
            Event.objects.create(
                job_id=job.pk, kind="phase:complete", detail=repr(attempt.returned)
            )
            return next_call(job, attempt)

        return middleware
