"""Publishing Celery tasks by name, now or once the surrounding transaction commits.

Each app's ``dispatch`` module names its tasks and offers one ``enqueue_*_on_commit``
helper per task its actions publish; the tasks modules call the actions. Publishing by
name (``send_task``) keeps the arrows one way (tasks -> actions -> dispatch), so no
import cycle hides inside a function body. In autocommit ``on_commit`` runs at once;
inside ``atomic`` it waits for the commit, so a worker never looks for a row it cannot
see yet.
"""

from __future__ import annotations

from django.db import transaction

from controlplane.celery import app


def publish(task_name: str, *args: object) -> None:
    """Publish ``task_name(*args)`` now: for the repair loops (sweep, reconcile), whose
    rows are committed already and whose message must not wait on anything."""
    app.send_task(task_name, args=list(args))


def enqueue_on_commit(task_name: str, *args: object) -> None:
    """Publish ``task_name(*args)`` once the current transaction commits."""
    transaction.on_commit(lambda: publish(task_name, *args))
