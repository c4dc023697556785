"""One client connection: a thin shell around websockets' Sans-I/O ``ServerProtocol``.

With TLS (``--tls-cert``/``--tls-key``) the socket is wrapped at accept and the
handshake runs in this connection's thread within the authentication deadline; the
pre-auth byte cap then counts the decrypted bytes (the TLS handshake itself is bounded
by the TLS library and that deadline).

The shell owns the socket, so it sees every raw byte: before authentication at most
``protocol.PRE_AUTH_MAX_BYTES`` may arrive, counted from the first byte (the HTTP
handshake included) and still counted after a refused ``auth`` until the socket closes.
Crossing the cap closes the socket at once, without a close handshake: the point is to
stop spending anything on the peer.

One thread per connection runs ``serve``: ``recv`` -> ``receive_data`` ->
``events_received`` -> handle -> ``data_to_send`` -> ``sendall``. Execution threads send
their frames through ``send`` under the same lock, so the protocol object (which is not
thread-safe) is only touched by one thread at a time.
"""

from __future__ import annotations

import hmac
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

from websockets.frames import Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from . import protocol
from .executions import Refused, run_execution
from .log import log

if TYPE_CHECKING:
    from .server import Host

# RFC 6455 7.4.1 close codes we use.
CLOSE_GOING_AWAY = 1001  # "an endpoint is going away, such as a server going down"
CLOSE_POLICY_VIOLATION = 1008  # auth failed, or a frame before auth


class Connection:
    def __init__(self, host: Host, sock: socket.socket, peer: str, conn_id: str) -> None:
        self.host = host
        self.sock = sock
        self.peer = peer
        self.id = conn_id
        self.ws = ServerProtocol(max_size=protocol.MAX_FRAME_BYTES)
        self.lock = threading.RLock()
        self.authenticated = False
        self.pre_auth_bytes = 0
        self.opened_at = time.monotonic()
        self.close_deadline: float | None = None
        self.executions: set[str] = set()
        self._fragments: list[bytes] = []
        self.thread = threading.Thread(target=self.serve, name=f"conn-{conn_id}", daemon=True)

    # --- the read loop -----------------------------------------------------------

    def serve(self) -> None:
        reason = "eof"
        try:
            reason = self._loop()
        except OSError as exc:
            reason = f"socket_error:{exc.__class__.__name__}"
        except Exception as exc:  # a bug in one connection must not take the host down
            reason = f"internal_error:{exc.__class__.__name__}"
        finally:
            for execution_id in list(self.executions):
                # The client that would read the result is gone: free the slot now.
                self.host.admission.stop(execution_id, "cancelled", "the client connection closed")
            self._abort()
            self.host.forget(self)
            log(
                "connection_closed",
                conn=self.id,
                reason=reason,
                authenticated=self.authenticated,
                pre_auth_bytes=self.pre_auth_bytes,
                close_code=self.ws.close_code,
            )

    def _tls_handshake(self, auth_deadline: float) -> None:
        """Finish the TLS handshake within the authentication deadline (a peer that
        stalls it costs no more than one that never authenticates)."""
        self.sock.settimeout(max(0.05, auth_deadline - time.monotonic()))
        self.sock.do_handshake()

    def _loop(self) -> str:
        settings = self.host.settings
        auth_deadline = self.opened_at + settings.auth_timeout_s
        if isinstance(self.sock, ssl.SSLSocket):
            try:
                self._tls_handshake(auth_deadline)
            except (ssl.SSLError, OSError):
                return "tls_handshake_failed"
        self.sock.settimeout(settings.send_timeout_s)
        while True:
            now = time.monotonic()
            if self.close_deadline is not None and now >= self.close_deadline:
                return "close_timeout"
            if not self.authenticated and self.close_deadline is None and now >= auth_deadline:
                if self.ws.state is not State.OPEN:
                    return "auth_timeout"  # not even a handshake: nothing to say, just drop it
                self._refuse("auth_timeout", "no valid auth frame before the deadline")
                continue
            # TLS may hold decrypted bytes the kernel no longer reports as readable.
            pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
            if not pending:
                readable, _, _ = select.select([self.sock], [], [], settings.poll_interval_s)
                if not readable:
                    continue
            # Before auth read at most one byte past the cap, so it is crossed exactly.
            size = 65536 if self.authenticated else protocol.PRE_AUTH_MAX_BYTES - self.pre_auth_bytes + 1
            if isinstance(self.sock, ssl.SSLSocket):
                # One TLS connection object must not read and write in two threads at
                # once (OpenSSL); execution threads write under this lock.
                with self.lock:
                    data = self.sock.recv(size)
            else:
                data = self.sock.recv(size)
            if not data:
                with self.lock:
                    self.ws.receive_eof()
                    self._flush()
                return "eof"
            if not self.authenticated:
                self.pre_auth_bytes += len(data)
            with self.lock:
                self.ws.receive_data(data)
                events = self.ws.events_received()
                self._flush()
            for event in events:
                self._handle_event(event)
            if not self.authenticated and self.pre_auth_bytes > protocol.PRE_AUTH_MAX_BYTES:
                log("pre_auth_limit", conn=self.id, bytes=self.pre_auth_bytes, limit=protocol.PRE_AUTH_MAX_BYTES)
                return "pre_auth_limit"
            with self.lock:
                if self.ws.state is State.CLOSED:
                    return "closed"
                if self.ws.close_expected() and self.close_deadline is None:
                    self.close_deadline = time.monotonic() + settings.close_timeout_s

    def _handle_event(self, event: object) -> None:
        if isinstance(event, Request):
            with self.lock:
                response = self.ws.accept(event)
                self.ws.send_response(response)
                self._flush()
            return
        opcode = getattr(event, "opcode", None)
        if opcode in (Opcode.TEXT, Opcode.BINARY):
            self._fragments = [event.data]
        elif opcode is Opcode.CONT:
            self._fragments.append(event.data)
        else:
            return  # ping/pong/close: the protocol object answers those itself
        if event.fin:
            message, self._fragments = b"".join(self._fragments), []
            self._handle_message(message)

    # --- frames ------------------------------------------------------------------

    def _handle_message(self, message: bytes) -> None:
        if not self.authenticated and self.close_deadline is not None:
            return  # already refused: nothing this peer says changes that
        try:
            frame = protocol.decode(message)
        except protocol.ProtocolError as exc:
            if not self.authenticated:
                self._refuse("unauthenticated", "the first frame must be a valid auth frame")
            else:
                # Bad input is answered, not punished: the connection stays open.
                self.send(protocol.Error(code=exc.code, message=exc.message, id=exc.frame_id))
            return
        if not self.authenticated:
            self._authenticate(frame)
        elif isinstance(frame, protocol.Execute):
            self._execute(frame)
        elif isinstance(frame, protocol.Cancel):
            if frame.id not in self.executions or not self.host.admission.stop(
                frame.id, "cancelled", "Execution was cancelled"
            ):
                self.send(protocol.Error(code="unknown_id", message="no running execution has this id", id=frame.id))
        elif isinstance(frame, protocol.LaunchRun):
            self.send(self.host.runs.launch(frame))
        elif isinstance(frame, protocol.StopRun):
            self.send(self.host.runs.stop(frame.id))
        elif isinstance(frame, protocol.ProbeRuns):
            self.send(self.host.runs.probe(frame))
        elif isinstance(frame, protocol.Auth):
            self.send(protocol.Error(code="bad_field", message="this connection is already authenticated"))
        else:
            self.send(protocol.Error(code="unknown_type", message=f"a client does not send {frame.type!r} frames"))

    def _authenticate(self, frame: protocol.Frame) -> None:
        if not isinstance(frame, protocol.Auth):
            self._refuse("unauthenticated", "the first frame must be auth")
            return
        # Constant time: how much of a guess matched must not show in the timing.
        if not hmac.compare_digest(frame.token.encode(), self.host.token.encode()):
            self._refuse("auth_failed", "invalid token")
            return
        self.authenticated = True
        draining = self.host.mark_authenticated(self)
        log("connection_authenticated", conn=self.id, client=frame.client[:80], draining=draining)
        isolation = self.host.isolation
        self.send(
            protocol.AuthOk(
                host_id=self.host.host_id,
                draining=draining,
                isolation=isolation.name,
                bounds={**isolation.bounds(), "reserve": self.host.reserve.size if self.host.reserve else 0},
            )
        )

    def _refuse(self, code: str, message: str) -> None:
        """Answer an error frame and start the close handshake. The pre-auth byte cap
        keeps applying until the socket is gone."""
        log("connection_refused", conn=self.id, code=code)
        self.send(protocol.Error(code=code, message=message))
        self.close(CLOSE_POLICY_VIOLATION, code)

    def _execute(self, frame: protocol.Execute) -> None:
        if frame.timeout_ms <= 0 or frame.memory_mb <= 0:
            message = "timeout_ms and memory_mb must be positive"
            self.send(protocol.Error(code="bad_field", message=message, id=frame.id))
            return
        try:
            running = self.host.admission.admit(frame.id)
        except Refused as refusal:
            log("execution_refused", conn=self.id, id=frame.id, answer=refusal.frame.type, reason=refusal.args[0])
            self.send(refusal.frame)
            return
        self.executions.add(frame.id)

        def body() -> None:
            try:
                run_execution(
                    frame,
                    running,
                    admission=self.host.admission,
                    isolation=self.host.isolation,
                    send=self.send,
                    conn_id=self.id,
                    reserve=self.host.reserve,
                )
            finally:
                self.executions.discard(frame.id)

        threading.Thread(target=body, name=f"exec-{frame.id}", daemon=True).start()

    # --- output ------------------------------------------------------------------

    def send(self, frame: protocol.Frame) -> bool:
        """Send one frame if the connection is open; False if it is not."""
        if isinstance(frame, protocol.Result):
            # The raw output is capped per stream, but JSON escaping can still grow the
            # frame past what a client accepts: cut it to fit, never send it too large.
            frame = protocol.fit_result(frame)
        with self.lock:
            if self.ws.state is not State.OPEN:
                return False
            self.ws.send_text(protocol.encode(frame).encode("utf-8"))
            try:
                self._flush()
            except OSError:
                return False
            return True

    def close(self, code: int, reason: str) -> None:
        """Start the WebSocket close handshake; the read loop finishes it or times out."""
        with self.lock:
            if self.ws.state is State.OPEN:
                self.ws.send_close(code, reason)
                try:
                    self._flush()
                except OSError:
                    pass
            if self.close_deadline is None:
                self.close_deadline = time.monotonic() + self.host.settings.close_timeout_s

    def _flush(self) -> None:
        for data in self.ws.data_to_send():
            if data:
                self.sock.sendall(data)
            else:  # the protocol's end-of-stream marker: half-close our side
                try:
                    self.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def _abort(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
