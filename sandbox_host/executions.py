"""Admission and the life of one execution on the host.

``Admission`` is the host-wide ledger: which ids run, which slots (and so which uids)
are free, and whether the host is draining. Every refusal happens here, before any
process exists, which is what lets ``not_started`` promise the code never ran.

``run_execution`` is the body of one execution's thread: start the child, say
``started``, wait, say ``result``, free the slot. A prepared sandbox SIGKILLed from
outside before it read its code (``Child.died_unread``) is replaced by the next, the
code never having run; after a few, the execution is answered ``not_started`` instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from holdfast_wire import protocol

from . import defaults
from .children import Child, ChildError, ChildOutcome, Limits
from .isolation import Isolation
from .log import log
from .reserve import Reserve

# A slot is normally free at once (there are max_concurrent + reserve of them); a
# finished execution still cleaning up may hold one for a moment.
SLOT_WAIT_S = 5.0


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
    finished: bool = False
    # What a stop asked the execution to end as (``Admission.stop``).
    stop_status: str = "cancelled"
    stop_error: str = "Execution was cancelled"


class Admission:
    """Executions running at once are capped at ``max_concurrent``. Uids come from a
    separate pool of ``max_concurrent + spare`` slots: a prepared sandbox (``reserve``)
    holds one while it waits, and a finished execution holds its own until its clean-up
    is done, after its result was sent."""

    def __init__(self, max_concurrent: int, *, spare: int = 0) -> None:
        self._cond = threading.Condition()
        self.max_concurrent = max_concurrent
        self._free_slots = list(range(max_concurrent + spare - 1, -1, -1))
        self._running: dict[str, Running] = {}
        self.draining = False

    def admit(self, execution_id: str) -> Running:
        """Admit ``execution_id`` or raise ``Refused``. Its slot comes later (a prepared
        sandbox's, or ``take_slot``)."""
        with self._cond:
            if execution_id in self._running:
                raise Refused(
                    protocol.Error(code="duplicate_id", message="an execution with this id is running", id=execution_id)
                )
            # Both refusals below happen before any process exists for the id: the pool
            # may send it elsewhere because it provably never ran here.
            if self.draining:
                raise Refused(protocol.NotStarted(id=execution_id, reason="draining"))
            if sum(not r.finished for r in self._running.values()) >= self.max_concurrent:
                raise Refused(protocol.NotStarted(id=execution_id, reason="at_capacity"))
            running = Running(execution_id, -1)
            self._running[execution_id] = running
            return running

    def take_slot(self, timeout: float = 0.0) -> int | None:
        """A free slot (its uid is ours until ``return_slot``), waiting up to
        ``timeout`` for one; None if there is none."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free_slots, timeout=timeout):
                return None
            return self._free_slots.pop()

    def return_slot(self, slot: int) -> None:
        with self._cond:
            if slot >= 0:
                self._free_slots.append(slot)
                self._cond.notify_all()

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
            if not running.cancel_requested:
                running.cancel_requested = True
                running.stop_status, running.stop_error = status, error
            child = running.child
        if child is not None:
            child.stop(status, error)
        return True

    def finish(self, running: Running) -> None:
        """The execution is over and its result about to be sent: it counts toward the
        admission limit no more, so a client that answers a result with new work finds
        room. It stays in flight (the drain waits for it) until ``release``."""
        with self._cond:
            running.finished = True

    def release(self, running: Running) -> None:
        """Its result is sent and everything of it is gone: the drain may stop waiting
        for it, and its slot (and uid) may be used again."""
        with self._cond:
            running.finished = True
            # Only this execution's entry: after an early release the id may be reused.
            if self._running.get(running.id) is running:
                del self._running[running.id]
            slot, running.slot = running.slot, -1
            if slot >= 0:
                self._free_slots.append(slot)
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
    reserve: Reserve | None = None,
) -> None:
    """Thread body for one admitted execution. Always releases its slot."""
    limits = Limits(timeout_ms=frame.timeout_ms, memory_mb=frame.memory_mb)
    child: Child | None = None
    try:
        lost = 0  # sandboxes killed before they read the code
        while True:
            child, prepared = None, False
            if lost < defaults.DEFAULT_UNREAD_SANDBOX_RETRIES:
                child, prepared = _start(
                    frame, running, limits, admission=admission, isolation=isolation, reserve=reserve
                )
            if child is None:
                # No process has read the code, so it provably never ran: not_started,
                # not a failure (after ``started`` too).
                log("execution_not_started", conn=conn_id, id=frame.id, reason="spawn_failed")
                # Free the id before answering: the pool moves the execution at once,
                # maybe back to this host, which must not call it a duplicate.
                admission.release(running)
                send(protocol.NotStarted(id=frame.id, reason="spawn_failed"))
                return
            if not admission.attach(running, child):
                child.stop(running.stop_status, running.stop_error)
            if not lost:
                log(
                    "execution_started",
                    conn=conn_id,
                    id=frame.id,
                    slot=running.slot,
                    timeout_ms=frame.timeout_ms,
                    prepared=prepared,
                )
                send(protocol.Started(id=frame.id))
            outcome = child.wait()
            if not child.died_unread:
                break
            # Killed from outside with its code written but not one byte read: the code
            # never ran, so it gets another sandbox (DESIGN.md: an execution is never
            # lost to the reserve, and never run twice).
            lost += 1
            log("execution_sandbox_died_unread", conn=conn_id, id=frame.id, slot=running.slot, lost=lost)
            child.cleanup()
            admission.return_slot(running.slot)
            running.slot, child = -1, None
            if running.cancel_requested:
                # Stopped while it had no sandbox: it ends so, nothing started for it.
                outcome = ChildOutcome(running.stop_status, None, "", "", outcome.duration_ms, running.stop_error)
                break
        admission.finish(running)
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
        # Logged once the result is on its way: the caller does not wait for our log.
        log(
            "execution_finished",
            conn=conn_id,
            id=frame.id,
            status=outcome.status,
            exit_code=outcome.exit_code,
            duration_ms=outcome.duration_ms,
        )
        if reserve is not None:
            # Whether it ran prepared or not (the reserve may be empty): the host is busy.
            reserve.replenish()
    except Exception as exc:  # a host bug must not leak the slot or kill the connection thread
        log("execution_internal_error", conn=conn_id, id=frame.id, error=exc.__class__.__name__)
        if child is not None:
            child.kill()
        send(protocol.Error(code="internal", message="the host failed running this execution", id=frame.id))
    finally:
        # After the result: the clean-up (its groups, anything left of its uid) is not
        # the caller's wait. The slot is reused only once it is done.
        if child is not None:
            child.cleanup()
        admission.release(running)


def _start(
    frame: protocol.Execute,
    running: Running,
    limits: Limits,
    *,
    admission: Admission,
    isolation: Isolation,
    reserve: Reserve | None,
) -> tuple[Child | None, bool]:
    """A child running ``frame``'s code, and whether it was prepared: one from the
    reserve when one fits, else a fresh one. None if neither could be had (nothing ran)."""
    if reserve is not None:
        while (prepared := reserve.take(limits)) is not None:
            running.slot = prepared.slot
            try:
                prepared.deliver(frame.code, limits)
                return prepared, True
            except BaseException as exc:
                # It died waiting (it never read the code): let it go, try the next. A
                # host bug lets it go too, so no sandbox outlives the slot handed back.
                prepared.discard()
                prepared.cleanup()
                admission.return_slot(prepared.slot)
                running.slot = -1
                if not isinstance(exc, ChildError):
                    raise
    slot = admission.take_slot(timeout=SLOT_WAIT_S)
    if slot is None:
        return None, False
    running.slot = slot
    child = Child(frame.code, limits, isolation=isolation, uid=isolation.uid_for(slot), slot=slot)
    try:
        child.start()
    except ChildError:
        return None, False
    return child, False
