"""The Python API services call: ``execute`` (blocking) and ``submit`` (async).

Both go the full path: a row, a Celery task, a worker's pool, a host. ``execute`` waits
on the row, so it works from any process that reaches the database, with or without a
pool of its own. On PostgreSQL it is woken by the result's notification
(``notify.py``) and reads the row then, with a slow poll as the safety net; on SQLite it
polls the row.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.pool.outcome import CANCELLED, NO_WORKER
from holdfast_wire import backoff

# The caller's wait beyond the execution's own timeout: queueing, connecting, moves.
WAIT_MARGIN_S = 60.0
# Row polling without notifications (SQLite): quick at first for short snippets, then
# backing off to spare the database.
POLL_FIRST_S = 0.02
POLL_MAX_S = 0.5
# With notifications, the row is still read this often: the safety net for a lost one.
SAFETY_POLL_S = 1.0
# How long execute() waits for the process's listener to be up before it polls instead.
LISTENER_READY_S = 2.0


@dataclass(frozen=True)
class ExecutionResult:
    id: str | None
    status: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_ms: int | None = None
    error: str = ""
    host_id: str = ""
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"


Cancel = Callable[[], bool] | object | None


class _Stats(threading.local):
    """What the last execute() in this thread did: row reads, and whether the result's
    notification woke it (for tests and the bench; nothing decides on it)."""

    reads = 0
    last_woken_by_notification = False


stats = _Stats()


def _is_cancelled(cancel: Cancel) -> bool:
    if cancel is None:
        return False
    is_set = getattr(cancel, "is_set", None)  # threading.Event
    if callable(is_set):
        return bool(is_set())
    if callable(cancel):
        return bool(cancel())
    return False


def submit(code: str, *, owner: str, timeout_s: float | None = None, memory_mb: int | None = None) -> uuid.UUID:
    """Queue ``code`` for ``owner`` (an owner's name) and return the execution id.

    Raises ValueError for bad input, and an OwnerError subclass
    (controlplane/owners/errors.py: ``.code``, ``.http_status``, ``.retry_after_s``) for
    an unknown or disabled owner, an owner over a cap, or a full deployment. After
    commit a Celery message nudges a worker to dispatch one slot; which queued
    execution that slot runs is decided by the fair rule (dispatch.py)."""
    return _submit(code, owner=owner, timeout_s=timeout_s, memory_mb=memory_mb)


def _submit(
    code: str, *, owner: str, timeout_s: float | None, memory_mb: int | None, execution_id: uuid.UUID | None = None
) -> uuid.UUID:
    from controlplane.executions import actions, enqueue

    row = actions.create(code, owner=owner, timeout_s=timeout_s, memory_mb=memory_mb, execution_id=execution_id)
    # Published once the row is visible to the worker that will claim it: at once when
    # create's own transaction has committed, or when the caller's does (the public API
    # stores its idempotency record in the same one). One nudge per accepted row: as many
    # dispatches as there is work.
    enqueue.enqueue_execution_on_commit(row.pk)
    return row.pk


def execute(
    code: str,
    *,
    owner: str,
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    cancel: Cancel = None,
    wait_s: float | None = None,
    pickup_wait_s: float | None = None,
) -> ExecutionResult:
    """Run ``code`` and wait for its result. ``cancel`` is a ``threading.Event`` or a
    callable; a call already cancelled returns at once without touching the database or
    the network. With ``pickup_wait_s``, an execution no worker claimed by then is
    cancelled and reported as such (no worker is running)."""
    if _is_cancelled(cancel):
        return ExecutionResult(id=None, status="cancelled", error=CANCELLED)
    from controlplane.executions import notify

    execution_id = uuid.uuid4()
    results = notify.listener()
    woken = None
    if results is not None and results.ready(LISTENER_READY_S):
        # Registered before the row exists: its result can only be stored after, and
        # wakes us, so the first read waits for that (or for the safety net).
        woken = results.register(str(execution_id))
    try:
        _submit(code, owner=owner, timeout_s=timeout_s, memory_mb=memory_mb, execution_id=execution_id)
        return _wait(
            execution_id, woken, cancel=cancel, wait_s=wait_s, pickup_wait_s=pickup_wait_s, registered_first=True
        )
    finally:
        if woken is not None:
            results.unregister(str(execution_id), woken)


def _wait(
    execution_id,
    woken,
    *,
    cancel: Cancel,
    wait_s: float | None,
    pickup_wait_s: float | None,
    registered_first: bool = False,
):
    """Read the row until it is terminal, woken by ``woken`` (the result's notification)
    or polling without one. ``registered_first``: ``woken`` was registered before the row
    was created, so nothing is there to read until it is set or the safety net expires."""
    from controlplane.executions import actions
    from controlplane.executions.models import TERMINAL, Execution

    started = time.monotonic()
    deadline = None
    polls = 0
    cancel_sent = False
    stats.reads = 0
    if woken is not None and registered_first:
        woken.wait(min([SAFETY_POLL_S, *(s for s in (wait_s, pickup_wait_s) if s is not None)]))
    while True:
        announced = woken.result if woken is not None else None
        if announced is not None and announced["status"] in TERMINAL:
            # The stored result came with its notification: the row as committed.
            stats.last_woken_by_notification = True
            return ExecutionResult(id=str(execution_id), **announced)
        row = Execution.objects.get(pk=execution_id)
        stats.reads += 1
        if deadline is None:
            deadline = started + (wait_s if wait_s is not None else row.timeout_ms / 1000 + WAIT_MARGIN_S)
        if row.status in TERMINAL:
            stats.last_woken_by_notification = woken is not None and woken.is_set()
            return _result(row)
        if pickup_wait_s is not None and row.status == "queued" and time.monotonic() - started > pickup_wait_s:
            from django.conf import settings

            error = NO_WORKER.format(seconds=pickup_wait_s, queue=settings.CELERY_TASK_DEFAULT_QUEUE)
            if actions.abandon_unclaimed(str(execution_id), error):
                return _result(Execution.objects.get(pk=execution_id))
        if not cancel_sent and (_is_cancelled(cancel) or time.monotonic() > deadline):
            # The caller gave up: make sure it does not run later with nobody listening.
            actions.request_cancel(str(execution_id))
            cancel_sent = True
            deadline = time.monotonic() + WAIT_MARGIN_S
        elif cancel_sent and time.monotonic() > deadline:
            return _result(row)
        if woken is not None:
            # Woken by the result's notification, or by the safety net.
            woken.wait(max(0.0, min(SAFETY_POLL_S, deadline - time.monotonic())) or POLL_FIRST_S)
            continue
        backoff.wait(polls, first_s=POLL_FIRST_S, max_s=POLL_MAX_S, factor=1.5)
        polls += 1


def cancel(execution_id: str) -> str:
    from controlplane.executions import actions

    return actions.request_cancel(execution_id)


def _result(row) -> ExecutionResult:
    return ExecutionResult(
        id=str(row.pk),
        status=row.status,
        stdout=row.stdout,
        stderr=row.stderr,
        exit_code=row.exit_code,
        duration_ms=row.duration_ms,
        error=row.error,
        host_id=row.host_id,
        attempts=row.attempts,
    )
