"""POST /executions with ``"wait": true``: block up to a bound for the result.

Woken by the result's notification where the process listens for them (PostgreSQL,
executions/notify.py), with a slow read of the row as the safety net; polling the row
elsewhere. Unlike ``execute()``, running out of time cancels nothing: the caller gets
202 and the execution goes on, to be read with GET /executions/{id}.
"""

from __future__ import annotations

import time
import uuid

from controlplane.executions import notify
from controlplane.executions.models import Execution

# How long to wait for this process's listener to be up before polling instead.
LISTENER_READY_S = 2.0
# With notifications, the row is still read this often (a lost notification).
SAFETY_POLL_S = 1.0
# Without them, polling starts quick for short snippets and backs off.
POLL_FIRST_S = 0.02
POLL_MAX_S = 0.5


def wait_for(execution_id: uuid.UUID, timeout_s: float) -> Execution:
    """The execution once terminal, or as it stands when ``timeout_s`` runs out."""
    results = notify.listener()
    woken = None
    if results is not None and results.ready(LISTENER_READY_S):
        # Registered before the first read: a result stored later wakes us, one stored
        # earlier is in the row we read next.
        woken = results.register(str(execution_id))
    try:
        deadline = time.monotonic() + timeout_s
        delay = POLL_FIRST_S
        while True:
            row = Execution.objects.get(pk=execution_id)
            left = deadline - time.monotonic()
            if row.is_terminal or left <= 0:
                return row
            if woken is not None:
                woken.wait(min(SAFETY_POLL_S, left))
            else:
                time.sleep(min(delay, left))
                delay = min(delay * 1.5, POLL_MAX_S)
    finally:
        if woken is not None:
            results.unregister(str(execution_id), woken)
