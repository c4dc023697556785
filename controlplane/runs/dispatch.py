"""Publishing the runs' Celery tasks once the surrounding transaction commits.

Actions and reconcile call these; the tasks module calls the actions. Publishing by
task name (``send_task``) keeps the arrows one way (tasks -> actions -> dispatch), so
no import cycle is hidden inside a function body. In autocommit, ``on_commit`` runs at
once; inside ``atomic`` it waits for the commit, so a worker never looks for a row it
cannot see yet.
"""

from __future__ import annotations

from django.db import transaction

from controlplane.celery import app

# The tasks' registered names (``controlplane/runs/tasks.py`` declares them with these).
LAUNCH_RUN = "controlplane.runs.tasks.launch_run"
STOP_RUN_SANDBOX = "controlplane.runs.tasks.stop_run_sandbox"
RECONCILE_RUNS = "controlplane.runs.tasks.reconcile_runs"
DELIVER_NOTIFICATION = "controlplane.runs.tasks.deliver_notification"


def publish(task_name: str, *args: object) -> None:
    """Publish ``task_name(*args)`` now: for the repair loops (sweep, reconcile), whose
    rows are committed already and whose message must not wait on anything."""
    app.send_task(task_name, args=list(args))


def enqueue_on_commit(task_name: str, *args: object) -> None:
    """Publish ``task_name(*args)`` once the current transaction commits."""
    transaction.on_commit(lambda: publish(task_name, *args))


def enqueue_launch_on_commit(run_id: object) -> None:
    enqueue_on_commit(LAUNCH_RUN, str(run_id))


def enqueue_stop_on_commit(run_id: object) -> None:
    enqueue_on_commit(STOP_RUN_SANDBOX, str(run_id))


def enqueue_notification_on_commit(notification_id: int) -> None:
    enqueue_on_commit(DELIVER_NOTIFICATION, notification_id)
