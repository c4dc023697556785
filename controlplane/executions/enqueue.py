"""The executions' tasks by name, and the helper the API calls to publish one after
commit (``controlplane.dispatch`` says why by name)."""

from __future__ import annotations

from controlplane.dispatch import enqueue_on_commit, publish

# The tasks' registered names (``controlplane/executions/tasks.py`` declares them).
RUN_EXECUTION = "controlplane.executions.tasks.run_execution"
STORE_OUTCOME = "controlplane.executions.tasks.store_outcome"
SWEEP_EXECUTIONS = "controlplane.executions.tasks.sweep_executions"

__all__ = ["enqueue_execution_on_commit", "publish"]


def enqueue_execution_on_commit(execution_id: object) -> None:
    enqueue_on_commit(RUN_EXECUTION, str(execution_id))
