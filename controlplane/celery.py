"""The Celery app. Settings come from Django's, under the ``CELERY_`` namespace."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_old_connections(sender=None, **_kwargs) -> None:
    """A task's database connections are kept as a request's are: closed when past
    ``CONN_MAX_AGE``, broken, or left inside a transaction, and health-checked by the next
    query otherwise (settings.CELERY_DB_REUSE_MAX says why Celery's own closing is off)."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return  # inside the caller's own transaction
    from django.db import close_old_connections

    close_old_connections()
