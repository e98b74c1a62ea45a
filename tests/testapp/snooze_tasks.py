"""``django.tasks`` tasks that snooze (tests/test_snooze.py)."""

from django_dbworker import Snooze
from django_dbworker.tasks.compat import require

from .models import Event

task = require().task


@task
def snooze_once(key):
    done = Event.objects.filter(kind=f"snooze:{key}").count()
    Event.objects.create(job_id=0, kind=f"snooze:{key}")
    if done == 0:
        raise Snooze(0)
    return done
