"""One client connection: the I/O shell around two Sans-I/O cores.

websockets' ``ServerProtocol`` turns bytes into WebSocket messages; the wire's
``ServerSession`` (``holdfast_wire.server``) holds the rules of the conversation:
pre-auth accounting, auth, bad input, drain. This shell owns the socket, the threads
and the timeouts (the authentication deadline, the close handshake), and does what the
session's events ask with the host's parts (admission, runs).

With TLS (``--tls-cert``/``--tls-key``) the socket is wrapped at accept and the
handshake runs in this connection's thread within the authentication deadline; the
pre-auth byte cap then counts the decrypted bytes (the TLS handshake itself is bounded
by the TLS library and that deadline).

The shell sees every raw byte and reports it to the session: crossing the pre-auth cap
closes the socket at once, without a close handshake: the point is to stop spending
anything on the peer.

One thread per connection runs ``serve``: ``recv`` -> ``receive_data`` ->
``events_received`` -> session ``receive`` -> handle -> ``data_to_send`` -> ``sendall``.
Execution threads send their frames through ``send`` under the same lock, so neither
protocol object (neither is thread-safe) is touched by two threads at a time.
"""

from __future__ import annotations

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

from holdfast_wire import protocol, server
from holdfast_wire.server import CLOSE_GOING_AWAY, CLOSE_POLICY_VIOLATION

from .executions import Refused, run_execution
from .log import log

if TYPE_CHECKING:
    from .server import Host

__all__ = ["CLOSE_GOING_AWAY", "CLOSE_POLICY_VIOLATION", "Connection"]


class Connection:
    def __init__(self, host: Host, sock: socket.socket, peer: str, conn_id: str) -> None:
        self.host = host
        self.sock = sock
        self.peer = peer
        self.id = conn_id
        self.ws = ServerProtocol(max_size=protocol.MAX_FRAME_BYTES)
        self.session = server.ServerSession(token=host.token)
        self.lock = threading.RLock()
        self.opened_at = time.monotonic()
        self.close_deadline: float | None = None
        self.executions: set[str] = set()
        self._fragments: list[bytes] = []
        self.thread = threading.Thread(target=self.serve, name=f"conn-{conn_id}", daemon=True)

    @property
    def authenticated(self) -> bool:
        return self.session.authenticated

    @property
    def pre_auth_bytes(self) -> int:
        return self.session.pre_auth_bytes

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
                with self.lock:
                    events = self.session.auth_timeout()
                self._handle_session_events(events)
                continue
            # TLS may hold decrypted bytes the kernel no longer reports as readable.
            pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
            if not pending:
                readable, _, _ = select.select([self.sock], [], [], settings.poll_interval_s)
                if not readable:
                    continue
            # Before auth the session allows one byte past the cap, so it is crossed exactly.
            size = self.session.read_size()
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
            over = self.session.data_received(len(data))
            with self.lock:
                self.ws.receive_data(data)
                events = self.ws.events_received()
                self._flush()
            for event in events:
                self._handle_event(event)
            if over:
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
            return  # closing before auth (refused, or the host drains): nothing changes that
        with self.lock:
            events = self.session.receive(message)
        self._handle_session_events(events)

    def _handle_session_events(self, events: list[server.Event]) -> None:
        # What the session answered goes out first: a refusal's error frame precedes
        # the close it asks for.
        self._send_queued()
        for event in events:
            if isinstance(event, server.Authenticated):
                self._authenticated(event.client)
            elif isinstance(event, server.Refused):
                log("connection_refused", conn=self.id, code=event.code)
                self.close(CLOSE_POLICY_VIOLATION, event.code)
            elif isinstance(event, server.ExecuteRequested):
                self._execute(event.frame)
            elif isinstance(event, server.CancelRequested):
                if event.id not in self.executions or not self.host.admission.stop(
                    event.id, "cancelled", "Execution was cancelled"
                ):
                    with self.lock:
                        self.session.unknown_id(event.id)
            elif isinstance(event, server.RunRequested):
                self.send(self._answer_run(event.frame))
        self._send_queued()

    def _answer_run(self, frame: protocol.LaunchRun | protocol.StopRun | protocol.ProbeRuns) -> protocol.Frame:
        if isinstance(frame, protocol.LaunchRun):
            return self.host.runs.launch(frame)
        if isinstance(frame, protocol.StopRun):
            return self.host.runs.stop(frame.id)
        return self.host.runs.probe(frame)

    def _authenticated(self, client: str) -> None:
        draining = self.host.mark_authenticated(self)
        log("connection_authenticated", conn=self.id, client=client, draining=draining)
        isolation = self.host.isolation
        self.send(
            protocol.AuthOk(
                host_id=self.host.host_id,
                draining=draining,
                isolation=isolation.name,
                bounds={**isolation.bounds(), "reserve": self.host.reserve.size if self.host.reserve else 0},
            )
        )

    def _execute(self, frame: protocol.Execute) -> None:
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

        self.host.workers.run(body, name=f"exec-{frame.id}")

    # --- output ------------------------------------------------------------------

    def send(self, frame: protocol.Frame) -> bool:
        """Send one frame if the connection is open; False if it is not."""
        with self.lock:
            self.session.send(frame)
            return self._send_queued()

    def drain(self, grace_ms: int) -> bool:
        """Tell the client this host takes no new work (``draining``)."""
        with self.lock:
            self.session.drain(grace_ms)
            return self._send_queued()

    def _send_queued(self) -> bool:
        """Write what the session queued; False when the connection is not open (the
        frames are dropped: nobody would read them)."""
        with self.lock:
            texts = self.session.data_to_send()
            if self.ws.state is not State.OPEN:
                return False
            for text in texts:
                self.ws.send_text(text.encode("utf-8"))
            try:
                self._flush()
            except OSError:
                return False
            return bool(texts)

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
