"""Celery tasks for executions. They take ids and call actions (STYLE habit 5)."""

from __future__ import annotations

import logging
import os
import socket
import time

from celery import shared_task

from controlplane.executions import actions
from controlplane.executions.models import Execution
from controlplane.sandbox.outcome import ExecRequest
from controlplane.sandbox.pool import get_pool

log = logging.getLogger("holdfast.executions")

# A running execution checks its row for a cancel request at most this often: one
# indexed read a second per execution is cheap, and a cancel lands within a second.
CANCEL_POLL_INTERVAL_S = 1.0


@shared_task(name="controlplane.executions.tasks.run_execution", acks_late=True)
def run_execution(execution_id: str) -> None:
    # Claim before anything is sent: a redelivered message finds the row taken and stops.
    if not actions.claim(execution_id, worker=f"{socket.gethostname()} pid={os.getpid()}"):
        log.info("event=execution_claim_lost execution_id=%s", execution_id)
        return
    row = Execution.objects.only("code", "timeout_ms", "memory_mb").get(pk=execution_id)
    cancel = _cancel_check(execution_id)
    outcome = get_pool().run(
        ExecRequest(id=execution_id, code=row.code, timeout_ms=row.timeout_ms, memory_mb=row.memory_mb),
        cancel=cancel,
    )
    actions.finish(execution_id, outcome)
    log.info(
        "event=execution_finished execution_id=%s status=%s host_id=%s attempts=%d",
        execution_id,
        outcome.status,
        outcome.host_id,
        outcome.attempts,
    )


@shared_task(name="controlplane.executions.tasks.sweep_executions")
def sweep_executions() -> dict[str, int]:
    return actions.sweep()


def _cancel_check(execution_id: str):
    last = [0.0]
    seen = [False]

    def check() -> bool:
        if seen[0]:
            return True
        now = time.monotonic()
        if now - last[0] < CANCEL_POLL_INTERVAL_S:
            return False
        last[0] = now
        seen[0] = actions.cancel_requested(execution_id)
        return seen[0]

    # The first look is immediate: a cancel that raced the claim must not be sent.
    return check
