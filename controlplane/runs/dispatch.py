"""The runs' tasks by name, and the helpers actions call to publish them after commit
(``controlplane.dispatch`` says why by name)."""

from __future__ import annotations

from controlplane.dispatch import enqueue_on_commit, publish

# The tasks' registered names (``controlplane/runs/tasks.py`` declares them with these).
LAUNCH_RUN = "controlplane.runs.tasks.launch_run"
STOP_RUN_SANDBOX = "controlplane.runs.tasks.stop_run_sandbox"
RECONCILE_RUNS = "controlplane.runs.tasks.reconcile_runs"
DELIVER_NOTIFICATION = "controlplane.runs.tasks.deliver_notification"

__all__ = ["enqueue_launch_on_commit", "enqueue_notification_on_commit", "enqueue_stop_on_commit", "publish"]


def enqueue_launch_on_commit(run_id: object) -> None:
    enqueue_on_commit(LAUNCH_RUN, str(run_id))


def enqueue_stop_on_commit(run_id: object) -> None:
    enqueue_on_commit(STOP_RUN_SANDBOX, str(run_id))


def enqueue_notification_on_commit(notification_id: int) -> None:
    enqueue_on_commit(DELIVER_NOTIFICATION, notification_id)
