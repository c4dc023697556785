"""One authenticated WebSocket connection from a worker process to a sandbox host: the
pool's thin I/O shell around a ``holdfast_wire.client.ClientSession``.

The session holds the protocol's rules (auth first, answers matched by id, what
``draining`` and ``not_started`` mean); this shell owns the socket, a reader thread
(the one caller of ``recv``), the waiters of the executions in flight, and the pool's
own rule of a max age. Senders share websocket-client's send lock. The connection's
life (``state.ConnState``):

    open --(max age reached, the host said it is draining)--> retiring
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

from controlplane.pool import wsclient
from controlplane.pool.outcome import ExecRequest
from controlplane.pool.state import ConnectionSnapshot, ConnState, RetireReason
from holdfast_wire import addresses, client, protocol
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.pool")

# Socket timeout once connected. It bounds every send, so a host that stopped reading
# (frozen, partitioned) cannot hold a caller, the send lock or the housekeeper beyond
# it; the reader treats a quiet socket as quiet and keeps waiting.
IO_TIMEOUT_S = 5.0

# How the session learned the host is draining -> what the pool records.
_DRAINING_REASONS = {
    "auth_ok": RetireReason.HOST_DRAINING,
    "draining": RetireReason.HOST_DRAINING,
    "not_started": RetireReason.HOST_REFUSED_DRAINING,
}


class ConnectFailed(Exception):
    """Connecting or authenticating failed; nothing was sent on this connection."""


@dataclass
class Pending:
    request: ExecRequest
    done: threading.Event = field(default_factory=threading.Event)
    frame: protocol.Frame | None = None  # Result, NotStarted or Error
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
        notify: Callable[[str, ConnectionSnapshot], None] | None = None,
    ) -> None:
        """``on_change`` wakes the pool's waiters; ``notify(hook, snapshot)`` tells the
        pool's listeners (``state.PoolListener``) of a state change."""
        self.url = url
        self.max_age_s = max_age_s
        self.limit = limit
        self.session: client.ClientSession | None = None
        self.state = ConnState.OPEN
        self.retire_reason: RetireReason | None = None
        self.opened_at = clock()
        self._clock = clock
        self._on_change = on_change
        self._notify = notify or (lambda hook, snapshot: None)
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}
        self._ws: websocket.WebSocket | None = None
        self._reader: threading.Thread | None = None
        self.finished_count = 0

    @property
    def host_id(self) -> str:
        return self.session.host_id if self.session is not None else ""

    @property
    def isolation(self) -> str:
        """What the host said of its containment in auth_ok (protocol.ISOLATION_LEVELS)."""
        auth_ok = self.session.auth_ok if self.session is not None else None
        return auth_ok.isolation if auth_ok is not None else ""

    @property
    def reserve(self) -> int | None:
        """How many sandboxes the host keeps prepared (None: a host that does not say)."""
        auth_ok = self.session.auth_ok if self.session is not None else None
        return (auth_ok.bounds or {}).get("reserve") if auth_ok is not None else None

    # --- lifecycle -----------------------------------------------------------------

    def connect(
        self, token: str, *, timeout_s: float, client: str, required_isolation: str = protocol.FULL_ISOLATION
    ) -> None:
        session = _new_session(token, client, required_isolation)
        try:
            ws, events = wsclient.dial(self.url, session, timeout_s=timeout_s, enable_multithread=True)
        except wsclient.DialFailed as exc:
            if exc.refusal is not None and exc.refusal.isolation:
                # DESIGN.md (Containment): pools refuse hosts below the required level,
                # before anything is sent to them.
                log.warning(
                    "host_refused",
                    extra=fields(host_id=exc.refusal.host_id, required=required_isolation, reason=exc.refusal.reason),
                )
                raise ConnectFailed(f"{exc} (HOLDFAST_REQUIRED_ISOLATION)") from None
            raise ConnectFailed(str(exc)) from None
        ws.settimeout(IO_TIMEOUT_S)
        self.session = session
        self._ws = ws
        self.opened_at = self._clock()
        self._notify("connection_opened", self.snapshot())
        self._act_on(events)
        self._reader = threading.Thread(target=self._read_loop, name=f"holdfast-conn-{self.host_id}", daemon=True)
        self._reader.start()
        log.info(
            "connection_opened",
            extra=fields(host_id=self.host_id, url=addresses.public(self.url), max_age_s=round(self.max_age_s, 1)),
        )

    def age(self) -> float:
        return self._clock() - self.opened_at

    def expired(self) -> bool:
        return self.age() >= self.max_age_s

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def can_take(self) -> bool:
        return self.state is ConnState.OPEN and not self.expired() and len(self._pending) < self.limit

    def snapshot(self) -> ConnectionSnapshot:
        return ConnectionSnapshot(
            host_id=self.host_id,
            url=addresses.public(self.url),  # it reaches the cache, the drain page, the registry
            state=self.state,
            retire_reason=self.retire_reason,
            age_s=round(self.age(), 3),
            max_age_s=round(self.max_age_s, 3),
            in_flight=self.in_flight,
            finished=self.finished_count,
            isolation=self.isolation,
            reserve=self.reserve,
        )

    def retire(self, reason: RetireReason) -> None:
        """Take no new work; close once what is in flight has finished."""
        with self._lock:
            if self.state is not ConnState.OPEN:
                return
            self.state = ConnState.RETIRING
            self.retire_reason = reason
            idle = not self._pending
        log.info(
            "connection_retiring",
            extra=fields(
                host_id=self.host_id, reason=str(reason), age_s=round(self.age(), 1), in_flight=len(self._pending)
            ),
        )
        self._notify("connection_retiring", self.snapshot())
        if idle:
            self.close("retired")
        self._on_change()

    def close(self, reason: str, *, graceful: bool = True) -> None:
        """Close the connection and resolve whatever is still pending as dropped.

        ``graceful=False`` skips the close frame: after a send failed part-way, any further
        byte would be read by the host as the rest of that frame."""
        with self._lock:
            if self.state is ConnState.CLOSED:
                return
            self.state = ConnState.CLOSED
            ws = self._ws
            if self.session is not None:
                self.session.connection_lost()
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
        log.info("connection_closed", extra=fields(host_id=self.host_id, reason=reason, age_s=round(self.age(), 1)))
        self._notify("connection_closed", self.snapshot())
        self._on_change()

    # --- work ----------------------------------------------------------------------

    def dispatch(self, request: ExecRequest) -> Pending | None:
        """Send ``request`` and return its pending slot, or ``None`` when it provably
        never left this process (the connection was closing, or the send failed before
        the whole frame was handed to the socket), so the caller may move it."""
        frame = protocol.Execute(
            id=request.id, code=request.code, timeout_ms=request.timeout_ms, memory_mb=request.memory_mb
        )
        with self._lock:
            if self.state is not ConnState.OPEN or self._ws is None or self.session is None:
                return None
            if self.expired():
                retire = True
            else:
                retire = False
                try:
                    text = self.session.send(frame)
                except client.SessionError:
                    return None  # the session is closing, or the id is already in flight here
                pending = Pending(request)
                self._pending[request.id] = pending
        if retire:
            self.retire(RetireReason.MAX_AGE)
            return None
        try:
            # websocket-client writes the whole frame or raises: a frame the host did not
            # receive in full cannot be parsed, let alone run, so a failure here is movable,
            # provided nothing more is written after it (hence graceful=False).
            self._ws.send(text)
        except (OSError, websocket.WebSocketException):
            with self._lock:
                self._pending.pop(request.id, None)
                self.session.forget(request.id)
            self.close("send failed", graceful=False)
            return None
        return pending

    def cancel(self, execution_id: str) -> None:
        ws, session = self._ws, self.session
        if ws is None or session is None or self.state is ConnState.CLOSED:
            return
        try:
            with self._lock:
                text = session.send(protocol.Cancel(id=execution_id))
            ws.send(text)
        except (OSError, websocket.WebSocketException, client.SessionError):
            pass

    def forget(self, execution_id: str, *, ran: bool = True) -> None:
        """The caller is done with ``execution_id`` (answered, cancelled or given up).
        ``ran=False`` for a not_started answer: it does not count as a finish."""
        with self._lock:
            if self.session is not None:
                self.session.forget(execution_id)
            if self._pending.pop(execution_id, None) is not None and ran:
                self.finished_count += 1
            close = self.state is ConnState.RETIRING and not self._pending
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
                    if self.state is ConnState.CLOSED:
                        break
                    continue
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                if opcode not in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY):
                    continue
                with self._lock:
                    events = self.session.receive(data) if self.session is not None else []
                self._act_on(events)
        except (OSError, websocket.WebSocketException, ValueError):
            pass
        finally:
            self.close("host closed the connection" if self.state is not ConnState.CLOSED else "closed")

    def _act_on(self, events: list[client.Event]) -> None:
        for event in events:
            if isinstance(event, client.HostDraining):
                self.retire(_DRAINING_REASONS.get(event.source, RetireReason.HOST_DRAINING))
            elif isinstance(event, (client.Answered, client.Movable)):
                pending = self._pending.get(event.id)
                if pending is not None:
                    pending.resolve(event.frame)
            elif isinstance(event, client.Ignored):
                log.warning("bad_frame", extra=fields(host_id=self.host_id, code=event.code))

    def _fail_pending(self) -> None:
        with self._lock:
            pending = list(self._pending.values())
        for item in pending:
            item.resolve(None, dropped=True)


def _new_session(token: str, client_label: str, required_isolation: str) -> client.ClientSession:
    return client.ClientSession(token=token, client=client_label, required_isolation=required_isolation)
