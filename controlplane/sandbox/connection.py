"""One authenticated WebSocket connection from a worker process to a sandbox host.

Several executions share a connection; the host answers each by id. A reader thread
owns ``recv``; senders share websocket-client's send lock. The connection's life:

    open --(max age reached, or the host said it is draining)--> retiring
    retiring --(nothing left in flight)--> closed
    open | retiring --(socket dropped)--> closed

A retiring connection takes no new work. Whatever was in flight when the socket dropped
may have run on the host, so it is resolved as interrupted and never re-sent.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import websocket

from controlplane.sandbox import wsclient
from controlplane.sandbox.outcome import ExecRequest
from holdfast_wire import protocol

log = logging.getLogger("holdfast.pool")

OPEN, RETIRING, CLOSED = "open", "retiring", "closed"

# Socket timeout once connected. It bounds every send, so a host that stopped reading
# (frozen, partitioned) cannot hold a caller, the send lock or the housekeeper beyond
# it; the reader treats a quiet socket as quiet and keeps waiting.
IO_TIMEOUT_S = 5.0


class ConnectFailed(Exception):
    """Connecting or authenticating failed; nothing was sent on this connection."""


@dataclass
class Pending:
    request: ExecRequest
    done: threading.Event = field(default_factory=threading.Event)
    frame: protocol.Frame | None = None  # Result or NotStarted
    dropped: bool = False
    started_at: float = field(default_factory=time.monotonic)

    _lock: threading.Lock = field(default_factory=threading.Lock)

    def resolve(self, frame: protocol.Frame | None, *, dropped: bool = False) -> None:
        # The reader (an answer) and a closing thread (a drop) may race: the first wins.
        with self._lock:
            if self.done.is_set():
                return
            self.frame = frame
            self.dropped = dropped
            self.done.set()


class HostConnection:
    def __init__(
        self,
        url: str,
        *,
        max_age_s: float,
        limit: int,
        on_change: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.max_age_s = max_age_s
        self.limit = limit
        self.host_id = ""
        # What the host said of its containment in auth_ok (protocol.ISOLATION_LEVELS),
        # and how many sandboxes it keeps prepared (None: a host that does not say).
        self.isolation = ""
        self.reserve: int | None = None
        self.state = OPEN
        self.retire_reason = ""
        self.opened_at = clock()
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}
        self._ws: websocket.WebSocket | None = None
        self._reader: threading.Thread | None = None
        self.finished_count = 0

    # --- lifecycle -----------------------------------------------------------------

    def connect(
        self, token: str, *, timeout_s: float, client: str, required_isolation: str = protocol.FULL_ISOLATION
    ) -> None:
        try:
            ws = wsclient.create_connection(self.url, timeout=timeout_s, enable_multithread=True)
        except Exception as exc:  # any failure to connect is a failed connect, nothing more
            raise ConnectFailed(_describe(exc)) from None
        try:
            ws.send(protocol.encode(protocol.Auth(token=token, client=client)))
            reply = protocol.decode(ws.recv())
        except (OSError, websocket.WebSocketException, protocol.ProtocolError) as exc:
            ws.shutdown()
            raise ConnectFailed(_describe(exc)) from None
        if not isinstance(reply, protocol.AuthOk):
            ws.shutdown()
            detail = reply.message if isinstance(reply, protocol.Error) else reply.type
            raise ConnectFailed(f"authentication refused ({detail})")
        # DESIGN.md (Containment): pools refuse hosts below the required level, before
        # anything is sent to them.
        refusal = protocol.isolation_refusal(reply.isolation, required_isolation)
        if refusal:
            ws.shutdown()
            log.warning(
                "event=host_refused host_id=%s isolation=%r required=%s",
                reply.host_id,
                reply.isolation,
                required_isolation,
            )
            raise ConnectFailed(f"host {reply.host_id}: {refusal} (HOLDFAST_REQUIRED_ISOLATION)")
        self.isolation = reply.isolation
        self.reserve = (reply.bounds or {}).get("reserve")
        ws.settimeout(IO_TIMEOUT_S)
        self._ws = ws
        self.host_id = reply.host_id
        self.opened_at = self._clock()
        if reply.draining:
            self.retire("host draining")
        self._reader = threading.Thread(target=self._read_loop, name=f"holdfast-conn-{self.host_id}", daemon=True)
        self._reader.start()
        log.info("event=connection_opened host_id=%s url=%s max_age_s=%.1f", self.host_id, self.url, self.max_age_s)

    def age(self) -> float:
        return self._clock() - self.opened_at

    def expired(self) -> bool:
        return self.age() >= self.max_age_s

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def can_take(self) -> bool:
        return self.state == OPEN and not self.expired() and len(self._pending) < self.limit

    def retire(self, reason: str) -> None:
        """Take no new work; close once what is in flight has finished."""
        with self._lock:
            if self.state != OPEN:
                return
            self.state = RETIRING
            self.retire_reason = reason
            idle = not self._pending
        log.info(
            "event=connection_retiring host_id=%s reason=%r age_s=%.1f in_flight=%d",
            self.host_id,
            reason,
            self.age(),
            len(self._pending),
        )
        if idle:
            self.close("retired")
        self._on_change()

    def close(self, reason: str, *, graceful: bool = True) -> None:
        """Close the connection and resolve whatever is still pending as dropped.

        ``graceful=False`` skips the close frame: after a send failed part-way, any further
        byte would be read by the host as the rest of that frame."""
        with self._lock:
            if self.state == CLOSED:
                return
            self.state = CLOSED
            ws = self._ws
        if ws is not None:
            if graceful:
                try:
                    ws.send_close(websocket.STATUS_NORMAL, reason.encode()[:120])
                except (OSError, websocket.WebSocketException):
                    pass
            # shutdown() wakes the reader blocked in recv (close() alone does not on Linux)
            # and sends the FIN the balancer and the host see.
            if ws.sock is not None:
                try:
                    ws.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            ws.shutdown()
        self._fail_pending()
        log.info("event=connection_closed host_id=%s reason=%r age_s=%.1f", self.host_id, reason, self.age())
        self._on_change()

    # --- work ----------------------------------------------------------------------

    def dispatch(self, request: ExecRequest) -> Pending | None:
        """Send ``request`` and return its pending slot, or ``None`` when it provably
        never left this process (the connection was closing, or the send failed before
        the whole frame was handed to the socket), so the caller may move it."""
        frame = protocol.encode(
            protocol.Execute(
                id=request.id, code=request.code, timeout_ms=request.timeout_ms, memory_mb=request.memory_mb
            )
        )
        with self._lock:
            if self.state != OPEN or self._ws is None:
                return None
            if self.expired():
                retire = True
            else:
                retire = False
                pending = Pending(request)
                self._pending[request.id] = pending
        if retire:
            self.retire("max age")
            return None
        try:
            # websocket-client writes the whole frame or raises: a frame the host did not
            # receive in full cannot be parsed, let alone run, so a failure here is movable,
            # provided nothing more is written after it (hence graceful=False).
            self._ws.send(frame)
        except (OSError, websocket.WebSocketException):
            with self._lock:
                self._pending.pop(request.id, None)
            self.close("send failed", graceful=False)
            return None
        return pending

    def cancel(self, execution_id: str) -> None:
        ws = self._ws
        if ws is None or self.state == CLOSED:
            return
        try:
            ws.send(protocol.encode(protocol.Cancel(id=execution_id)))
        except (OSError, websocket.WebSocketException):
            pass

    def forget(self, execution_id: str, *, ran: bool = True) -> None:
        """The caller is done with ``execution_id`` (answered, cancelled or given up).
        ``ran=False`` for a not_started answer: it does not count as a finish."""
        with self._lock:
            if self._pending.pop(execution_id, None) is not None and ran:
                self.finished_count += 1
            close = self.state == RETIRING and not self._pending
        if close:
            self.close("retired")
        self._on_change()

    # --- reader --------------------------------------------------------------------

    def _read_loop(self) -> None:
        ws = self._ws
        assert ws is not None
        try:
            while True:
                try:
                    opcode, data = ws.recv_data(control_frame=False)
                except websocket.WebSocketTimeoutException:
                    # A quiet socket, not a dead one. websocket-client keeps a partly read
                    # frame in its buffer, so the next recv resumes where this one stopped.
                    if self.state == CLOSED:
                        break
                    continue
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                if opcode not in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY):
                    continue
                self._handle(data)
        except (OSError, websocket.WebSocketException, ValueError):
            pass
        finally:
            self.close("host closed the connection" if self.state != CLOSED else "closed")

    def _handle(self, data: bytes) -> None:
        try:
            frame = protocol.decode(data)
        except protocol.ProtocolError as exc:
            log.warning("event=bad_frame host_id=%s code=%s", self.host_id, exc.code)
            return
        if isinstance(frame, protocol.Draining):
            self.retire("host draining")
            return
        frame_id = getattr(frame, "id", None)
        if isinstance(frame, (protocol.Result, protocol.NotStarted)) or (
            isinstance(frame, protocol.Error) and frame_id
        ):
            pending = self._pending.get(frame_id or "")
            if pending is not None:
                pending.resolve(frame)

    def _fail_pending(self) -> None:
        with self._lock:
            pending = list(self._pending.values())
        for item in pending:
            item.resolve(None, dropped=True)


def _describe(exc: BaseException) -> str:
    # Only the class and the first line of the OS reason, bounded: a handshake error's
    # text can carry response headers, and nothing here may echo a frame or the URL.
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{exc.__class__.__name__}: {text}"[:120] if text else exc.__class__.__name__
