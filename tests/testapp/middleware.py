"""Middleware the tests install (module level, so settings can name them)."""

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
