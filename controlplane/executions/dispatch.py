"""Publishing the executions' Celery tasks once the surrounding transaction commits.

The API and the sweep (actions) call this; the tasks module calls the actions.
Publishing by task name (``send_task``) keeps the arrows one way (tasks -> actions ->
dispatch). In autocommit, ``on_commit`` runs at once; inside ``atomic`` it waits for
the commit, so the worker that claims the row can see it.
"""

from __future__ import annotations

from django.db import transaction

from controlplane.celery import app

# The tasks' registered names (``controlplane/executions/tasks.py`` declares them).
RUN_EXECUTION = "controlplane.executions.tasks.run_execution"
STORE_OUTCOME = "controlplane.executions.tasks.store_outcome"
SWEEP_EXECUTIONS = "controlplane.executions.tasks.sweep_executions"


def publish(task_name: str, *args: object) -> None:
    """Publish ``task_name(*args)`` now: for the repair loops (sweep, reconcile), whose
    rows are committed already and whose message must not wait on anything."""
    app.send_task(task_name, args=list(args))


def enqueue_on_commit(task_name: str, *args: object) -> None:
    """Publish ``task_name(*args)`` once the current transaction commits."""
    transaction.on_commit(lambda: publish(task_name, *args))


def enqueue_execution_on_commit(execution_id: object) -> None:
    enqueue_on_commit(RUN_EXECUTION, str(execution_id))
