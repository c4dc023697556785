"""Admission and the life of one execution on the host.

``Admission`` is the host-wide ledger: which ids run, which slots (and so which uids)
are free, and whether the host is draining. Every refusal happens here, before any
process exists, which is what lets ``not_started`` promise the code never ran.

``run_execution`` is the body of one execution's thread: start the child, say
``started``, wait, say ``result``, free the slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from . import protocol
from .children import Child, ChildError, Limits
from .isolation import Isolation
from .log import log


class Refused(Exception):
    """``admit`` said no: ``frame`` is what to answer."""

    def __init__(self, frame: protocol.Frame) -> None:
        super().__init__(frame.type)
        self.frame = frame


@dataclass
class Running:
    id: str
    slot: int
    child: Child | None = None
    cancel_requested: bool = False


class Admission:
    def __init__(self, max_concurrent: int) -> None:
        self._cond = threading.Condition()
        self._free_slots = list(range(max_concurrent - 1, -1, -1))
        self._running: dict[str, Running] = {}
        self.draining = False

    def admit(self, execution_id: str) -> Running:
        """Reserve a slot for ``execution_id`` or raise ``Refused``."""
        with self._cond:
            if execution_id in self._running:
                raise Refused(
                    protocol.Error(code="duplicate_id", message="an execution with this id is running", id=execution_id)
                )
            # Both refusals below happen before any process exists for the id: the pool
            # may send it elsewhere because it provably never ran here.
            if self.draining:
                raise Refused(protocol.NotStarted(id=execution_id, reason="draining"))
            if not self._free_slots:
                raise Refused(protocol.NotStarted(id=execution_id, reason="at_capacity"))
            running = Running(execution_id, self._free_slots.pop())
            self._running[execution_id] = running
            return running

    def attach(self, running: Running, child: Child) -> bool:
        """Record the started child; False if a cancel arrived before it existed."""
        with self._cond:
            running.child = child
            return not running.cancel_requested

    def stop(self, execution_id: str, status: str, error: str = "") -> bool:
        with self._cond:
            running = self._running.get(execution_id)
            if running is None:
                return False
            running.cancel_requested = True
            child = running.child
        if child is not None:
            child.stop(status, error)
        return True

    def free_slot(self, running: Running) -> None:
        """The child is gone: its slot (and uid) may take new work. Called before the
        result is sent, so a client that answers a result with new work finds room."""
        with self._cond:
            if running.slot >= 0:
                self._free_slots.append(running.slot)
                running.slot = -1

    def release(self, running: Running) -> None:
        """The execution is over, its result sent: the drain may stop waiting for it."""
        self.free_slot(running)
        with self._cond:
            # Only this execution's entry: after an early release the id may be reused.
            if self._running.get(running.id) is running:
                del self._running[running.id]
            self._cond.notify_all()

    def in_flight(self) -> int:
        with self._cond:
            return len(self._running)

    def start_draining(self) -> None:
        with self._cond:
            self.draining = True

    def wait_idle(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._running, timeout=timeout)

    def stop_all(self, status: str, error: str) -> None:
        with self._cond:
            ids = list(self._running)
        for execution_id in ids:
            self.stop(execution_id, status, error)


def run_execution(
    frame: protocol.Execute,
    running: Running,
    *,
    admission: Admission,
    isolation: Isolation,
    send: Callable[[protocol.Frame], object],
    conn_id: str,
) -> None:
    """Thread body for one admitted execution. Always releases its slot."""
    child = Child(
        frame.code,
        Limits(timeout_ms=frame.timeout_ms, memory_mb=frame.memory_mb),
        isolation=isolation,
        uid=isolation.uid_for(running.slot),
    )
    try:
        try:
            child.start()
        except ChildError as exc:
            # No process exists, so the code provably never ran: not_started, not a failure.
            log("execution_not_started", conn=conn_id, id=frame.id, reason="spawn_failed", error=str(exc))
            # Free the id before answering: the pool moves the execution at once, maybe
            # back to this host, which must not call it a duplicate.
            admission.release(running)
            send(protocol.NotStarted(id=frame.id, reason="spawn_failed"))
            return
        if not admission.attach(running, child):
            child.stop("cancelled", "Execution was cancelled")
        log("execution_started", conn=conn_id, id=frame.id, slot=running.slot, timeout_ms=frame.timeout_ms)
        send(protocol.Started(id=frame.id))
        outcome = child.wait()
        child.cleanup()
        admission.free_slot(running)
        log(
            "execution_finished",
            conn=conn_id,
            id=frame.id,
            status=outcome.status,
            exit_code=outcome.exit_code,
            duration_ms=outcome.duration_ms,
        )
        send(
            protocol.Result(
                id=frame.id,
                status=outcome.status,
                exit_code=outcome.exit_code,
                stdout=outcome.stdout,
                stderr=outcome.stderr,
                duration_ms=outcome.duration_ms,
                error=outcome.error,
            )
        )
    except Exception as exc:  # a host bug must not leak the slot or kill the connection thread
        log("execution_internal_error", conn=conn_id, id=frame.id, error=exc.__class__.__name__)
        if running.slot >= 0:  # once freed, the slot's uid may belong to another execution
            child.kill()
        send(protocol.Error(code="internal", message="the host failed running this execution", id=frame.id))
    finally:
        child.cleanup()
        admission.release(running)
