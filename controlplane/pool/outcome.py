"""What the pool hands back for one execution, and the error texts a user can see.

The pool never raises for an execution's own fate: every path ends in an ``Outcome``
whose ``status`` is one of the execution statuses, so the task that stores it needs no
``except`` ladder and a new failure mode cannot escape as a 500.
"""

from __future__ import annotations

from dataclasses import dataclass

from holdfast_wire import protocol

# Texts are part of the product: operators grep for them and services match on status.
CANCELLED = "Execution cancelled"
TIMED_OUT = "Execution timed out after {ms} ms"
MISCONFIGURED = "The sandbox pool is not configured: {missing} is not set"
AT_CAPACITY = "Code execution is at capacity: no sandbox connection was free within {seconds:g} s"
CONNECT_FAILED = "Could not reach a sandbox host at {url}: {reason}"
NOT_PLACED = "Code execution could not be placed on a sandbox host after {moves} moves"
TOO_LARGE = "Code is too large to send to a sandbox host ({size} bytes encoded; the limit is {limit})"
NO_WORKER = (
    "No worker picked up the execution within {seconds:g} s, so it was cancelled: "
    "is a Celery worker (the Procfile's `worker`) running on queue {queue!r}?"
)
RESULT_NOT_STORABLE = "The execution ran ({status}) but the database refused its result, so its output is lost: {error}"
# The sweep's verdict on a row still running long past its timeout. A guess (the worker
# may only have been unable to store the result): a real outcome arriving later replaces it.
WORKER_LOST = "Code execution was interrupted because its worker stopped while it ran"
# DESIGN.md, seed 000: an execution that may have reached the host is never re-run; it
# fails with exactly this text when its connection drops.
INTERRUPTED = "Code execution was interrupted because the connection to its sandbox host closed"

# What a host may report for an execution it ran (the rest are the pool's own verdicts).
RESULT_STATUSES = protocol.RESULT_STATUSES


@dataclass(frozen=True)
class ExecRequest:
    id: str
    code: str
    timeout_ms: int
    memory_mb: int


@dataclass(frozen=True)
class Outcome:
    status: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    # The host's measure of the run (0 for one under a millisecond); None where nothing
    # was measured (never started, interrupted, refused).
    duration_ms: int | None = None
    error: str = ""
    host_id: str = ""
    # Connections tried: 1 plus the moves of an execution that provably never ran.
    attempts: int = 1
    # True once the execute frame was handed to a socket: from then on it is never re-sent.
    sent: bool = False

    @classmethod
    def system(cls, status: str, error: str, **fields: object) -> Outcome:
        return cls(status=status, error=error, **fields)  # type: ignore[arg-type]
