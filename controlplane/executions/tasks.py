"""Celery tasks for executions. They take ids and call actions (STYLE habit 5)."""

from __future__ import annotations

import logging
import os
import socket
import time

from celery import shared_task
from django.db import DatabaseError, OperationalError

from controlplane.executions import actions
from controlplane.executions.models import Execution
from controlplane.sandbox import outcome as texts
from controlplane.sandbox.outcome import ExecRequest, Outcome
from controlplane.sandbox.pool import get_pool

log = logging.getLogger("holdfast.executions")

# A running execution checks its row for a cancel request at most this often: one
# indexed read a second per execution is cheap, and a cancel lands within a second.
CANCEL_POLL_INTERVAL_S = 1.0
# A claim that hit a database error is retried with exponential backoff capped here.
CLAIM_RETRY_MAX_S = 30.0
# Writing a result: 1 + 2 + 4 + 8 + 16 s of patience before giving up to the sweep.
STORE_ATTEMPTS = 6


@shared_task(name="controlplane.executions.tasks.run_execution", acks_late=True, bind=True, max_retries=None)
def run_execution(self, execution_id: str) -> None:
    # Claim before anything is sent: a redelivered message finds the row taken and stops.
    try:
        claimed = actions.claim(execution_id, worker=f"{socket.gethostname()} pid={os.getpid()}")
    except OperationalError as exc:
        # The database is unreachable or (SQLite) locked: nothing was claimed or sent, so
        # trying again later is safe. Without this the message would be acked and lost.
        raise self.retry(exc=exc, countdown=min(2**self.request.retries, CLAIM_RETRY_MAX_S)) from None
    if not claimed:
        log.info("event=execution_claim_lost execution_id=%s", execution_id)
        return
    row = _with_db_patience(lambda: Execution.objects.only("code", "timeout_ms", "memory_mb").get(pk=execution_id))
    cancel = _cancel_check(execution_id)
    outcome = get_pool().run(
        ExecRequest(id=execution_id, code=row.code, timeout_ms=row.timeout_ms, memory_mb=row.memory_mb),
        cancel=cancel,
    )
    _store(execution_id, outcome)
    log.info(
        "event=execution_finished execution_id=%s status=%s host_id=%s attempts=%d",
        execution_id,
        outcome.status,
        outcome.host_id,
        outcome.attempts,
    )


def _store(execution_id: str, outcome) -> None:
    """Record the outcome, riding out a short database outage: the execution has run and
    must not be reported as interrupted because one write hit a locked database.

    A non-transient database error (the database refuses this result for good: a value
    it cannot hold) would fail the same way on every retry and leave the row ``running``
    until the sweep calls it interrupted. It becomes a ``failed`` outcome that names the
    error instead, stored without the fields that may have caused it."""
    try:
        recorded = _with_db_patience(lambda: actions.finish(execution_id, outcome))
    except OperationalError:
        raise
    except DatabaseError as exc:
        log.error(
            "event=execution_result_refused execution_id=%s error=%s", execution_id, type(exc).__name__, exc_info=True
        )
        refused = Outcome.system(
            "failed",
            texts.RESULT_NOT_STORABLE.format(status=outcome.status, error=_first_line(exc)),
            exit_code=outcome.exit_code,
            duration_ms=outcome.duration_ms,
            attempts=outcome.attempts,
        )
        recorded = _with_db_patience(lambda: actions.finish(execution_id, refused))
    if not recorded:
        log.warning("event=execution_result_not_recorded execution_id=%s reason=not_running", execution_id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _with_db_patience(call):
    for attempt in range(STORE_ATTEMPTS):
        try:
            return call()
        except OperationalError:
            if attempt == STORE_ATTEMPTS - 1:
                raise
            time.sleep(min(2**attempt, CLAIM_RETRY_MAX_S))
    raise AssertionError("unreachable")


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
