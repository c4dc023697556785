"""Celery tasks for executions. They take ids and call actions (STYLE habit 5)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import asdict

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from controlplane.commands import first_line
from controlplane.executions import actions, dispatch, enqueue
from controlplane.pool import outcome as texts
from controlplane.pool.outcome import ExecRequest, Outcome
from controlplane.pool.pool import get_pool
from holdfast_wire import backoff
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.executions")

# A running execution checks its row for a cancel request at most this often: one
# indexed read a second per execution is cheap, and a cancel lands within a second.
CANCEL_POLL_INTERVAL_S = 1.0
# A claim that hit a database error is retried with exponential backoff capped here.
CLAIM_RETRY_MAX_S = 30.0
# Writing a result inline: 1 + 2 + 4 s of patience (a locked SQLite file, a failover)
# before the outcome is handed to the broker (store_outcome) instead of holding a worker
# thread through a long outage.
STORE_ATTEMPTS = 4
# store_outcome's backoff between attempts, capped here: far below the broker's
# visibility timeout (a retry is a new message whose countdown the worker holds unacked),
# and short enough that a result lands within seconds of the database coming back.
STORE_RETRY_MAX_S = 10.0
# Errors that say the database could not be reached or the connection broke: the same
# write may succeed later. Every other DatabaseError is the database refusing the value.
TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)


class DatabaseAway(Exception):
    """A transient database error at a point where trying again is safe; Celery retries
    the task on it (``autoretry_for``) with its own exponential backoff. No jitter: each
    message retries for its own row, there is no herd of identical retries to spread."""


# Celery's own exponential backoff (1, 2, 4 ... s, capped per task) on DatabaseAway,
# for as long as it takes: acked late, so the message is never lost meanwhile.
RETRIED_WHILE_DATABASE_AWAY = {
    "acks_late": True,
    "bind": True,
    "max_retries": None,
    "autoretry_for": (DatabaseAway,),
    "retry_backoff": 1,
    "retry_jitter": False,
}


@shared_task(name=enqueue.RUN_EXECUTION, **RETRIED_WHILE_DATABASE_AWAY, retry_backoff_max=CLAIM_RETRY_MAX_S)
def run_execution(self, execution_id: str = "") -> None:
    """Dispatch one slot: claim the next queued execution by the fair rule (dispatch.py)
    and run it. ``execution_id`` is the row whose submission sent this nudge, kept for
    the log and for messages of the previous release; it is not necessarily the row that
    runs. Every message still claims at most one row, by compare-and-set, before
    anything is sent: a redelivered one can never send a row twice."""
    try:
        claimed = dispatch.claim_next(worker=f"{socket.gethostname()} pid={os.getpid()}")
    except TRANSIENT_DB_ERRORS as exc:
        # The database is unreachable or (SQLite) locked: nothing was claimed or sent, so
        # trying again later is safe. Without this the message would be acked and lost.
        _drop_connection()
        raise DatabaseAway(exc.__class__.__name__) from exc
    if claimed is None:
        log.info("execution_nothing_to_dispatch", extra=fields(nudged_by=execution_id))
        return
    execution_id = claimed.id
    cancel = _cancel_check(execution_id)
    outcome = get_pool().run(
        ExecRequest(id=execution_id, code=claimed.code, timeout_ms=claimed.timeout_ms, memory_mb=claimed.memory_mb),
        cancel=cancel,
    )
    try:
        _store(execution_id, outcome)
    except TRANSIENT_DB_ERRORS:
        # The outcome exists only in this process: hand it to the broker, which keeps it
        # durably (Redis; a restarted worker gets it back) until the database takes it.
        store_outcome.apply_async(args=[execution_id, asdict(outcome), time.time()], countdown=1)
        log.warning("execution_result_spooled", extra=fields(execution_id=execution_id, status=outcome.status))
        return
    log.info(
        "execution_finished",
        extra=fields(
            execution_id=execution_id, status=outcome.status, host_id=outcome.host_id, attempts=outcome.attempts
        ),
    )


@shared_task(name=enqueue.STORE_OUTCOME, **RETRIED_WHILE_DATABASE_AWAY, retry_backoff_max=STORE_RETRY_MAX_S)
def store_outcome(self, execution_id: str, outcome: dict, first_failed_at: float) -> None:
    """Record an outcome the worker that ran it could not store (a database outage).

    DESIGN.md: nothing may lose a result. The message carries the whole outcome, so the
    broker holds it while the database is away: each failed attempt publishes a retry
    (backoff capped at STORE_RETRY_MAX_S) before this message is acked, for as long as
    EXECUTION_RESULT_STORE_PATIENCE_S allows. Storing is a compare-and-set, so a
    duplicate delivery records nothing twice."""
    result = Outcome(**outcome)
    try:
        _store(execution_id, result, attempts=1, after_failure=True)
    except TRANSIENT_DB_ERRORS as exc:
        waited = time.time() - first_failed_at
        if waited > settings.EXECUTION_RESULT_STORE_PATIENCE_S:
            log.error(
                "execution_result_lost",
                extra=fields(execution_id=execution_id, status=result.status, waited_s=round(waited)),
            )
            return
        raise DatabaseAway(exc.__class__.__name__) from exc
    log.info(
        "execution_finished",
        extra=fields(
            execution_id=execution_id,
            status=result.status,
            host_id=result.host_id,
            attempts=result.attempts,
            spooled_s=round(time.time() - first_failed_at, 1),
        ),
    )


def _fits_int4(value: object) -> bool:
    return isinstance(value, int) and -(2**31) <= value < 2**31


def _store(execution_id: str, outcome: Outcome, *, attempts: int = STORE_ATTEMPTS, after_failure: bool = False) -> None:
    """Record the outcome, riding out a short database outage: the execution has run and
    must not be reported as interrupted because one write hit a locked database. Raises
    a transient error when the database stays away (the caller spools the outcome).

    A non-transient database error (the database refuses this result for good: a value
    it cannot hold) would fail the same way on every retry and leave the row ``running``
    until the sweep calls it interrupted. It becomes a ``failed`` outcome that names the
    error instead, stored without the fields that may have caused it.

    ``after_failure``: an earlier attempt failed (the outcome was spooled), so it may
    have committed with its reply lost, as a retry here may have."""
    tries = [0]

    def finish() -> bool:
        tries[0] += 1
        return actions.finish(execution_id, outcome)

    try:
        recorded = _with_db_patience(finish, attempts=attempts)
    except TRANSIENT_DB_ERRORS:
        raise
    except DatabaseError as exc:
        log.error(
            "execution_result_refused", extra=fields(execution_id=execution_id, error=type(exc).__name__), exc_info=True
        )
        refused = Outcome.system(
            "failed",
            texts.RESULT_NOT_STORABLE.format(status=outcome.status, error=first_line(exc)),
            # Only what the columns surely hold: a number out of their range may be what
            # the database refused, and would be refused again.
            exit_code=outcome.exit_code if _fits_int4(outcome.exit_code) else None,
            attempts=outcome.attempts,
        )
        recorded = _with_db_patience(lambda: actions.finish(execution_id, refused), attempts=attempts)
    if not recorded:
        log.warning("execution_result_not_recorded", extra=fields(execution_id=execution_id, reason="not_running"))
        if after_failure or tries[0] > 1:
            # An attempt whose reply was lost may have stored it and taken a parked
            # nudge back that nobody sent. Sent now: a spare nudge dispatches at most
            # one row that was queued anyway (dispatch.py), a lost one leaves a row
            # queued beside a free slot until the sweep.
            enqueue.publish(enqueue.RUN_EXECUTION, execution_id)


def _drop_connection() -> None:
    """Close this thread's database connection after a transient error, so the next
    attempt opens a fresh one instead of reusing a socket the outage broke."""
    with contextlib.suppress(DatabaseError):
        connection.close()


def _with_db_patience(call, *, attempts: int = STORE_ATTEMPTS):
    for attempt in range(attempts):
        try:
            return call()
        except TRANSIENT_DB_ERRORS:
            _drop_connection()
            if attempt == attempts - 1:
                raise
            backoff.wait(attempt, first_s=1.0, max_s=CLAIM_RETRY_MAX_S)
    raise AssertionError("unreachable")


@shared_task(name=enqueue.SWEEP_EXECUTIONS)
def sweep_executions() -> dict[str, int]:
    return actions.sweep()


def _cancel_check(execution_id: str):
    """The pool's cancel check for a claimed execution: its row, read at most every
    CANCEL_POLL_INTERVAL_S. The claim counts as the first look: a cancel made before it
    cancelled the queued row outright. One that raced it (it waited on the claim's row
    lock, then found the row running) is seen within the interval, after the code was
    sent, as one made a moment later is; an immediate read only narrowed that window,
    at a read on every execution's path."""
    last = [time.monotonic()]
    seen = [False]

    def check() -> bool:
        if seen[0]:
            return True
        now = time.monotonic()
        if now - last[0] < CANCEL_POLL_INTERVAL_S:
            return False
        last[0] = now
        try:
            seen[0] = actions.cancel_requested(execution_id)
        except DatabaseError:
            # A database outage does not stop the execution; ask again next time.
            _drop_connection()
            return False
        return seen[0]

    return check
