"""The host side of a session with one client, without I/O.

The host's connection (``sandbox_host/connection.py``) is a thin shell around one
``ServerSession``: it reports the raw bytes it reads (``data_received``), feeds each
complete message (``receive``), writes what ``data_to_send`` returns, and acts on the
events. The session holds the rules (docs/protocol.md):

* pre-auth accounting: before authentication at most ``PRE_AUTH_MAX_BYTES`` raw bytes
  may arrive, counted from the first byte (the HTTP handshake included) and still
  counted after a refused ``auth``; crossing the cap is ``PreAuthLimit`` and the shell
  drops the socket at once, without a close handshake;
* auth: the first frame must be ``auth`` with the right token (compared in constant
  time); anything else is answered with an ``error`` and ``Refused`` (the shell starts
  the close handshake), after which nothing the peer says changes anything;
* after auth, bad input is answered with an ``error`` frame and the connection stays
  open; an unknown frame type too, so a newer client can probe (compatibility);
* admission answers: the shell decides (``admit``) and answers through ``send``
  (``not_started``, ``duplicate_id``), or ``unknown_id`` for a cancel of nothing;
* drain: ``drain(grace_ms)`` tells an authenticated client to send no new work.

Timeouts (the authentication deadline, the close handshake) are the shell's.

Events::

    Authenticated(client)        the token matched: the shell answers auth_ok
    Refused(code)                refused before auth: close with CLOSE_POLICY_VIOLATION
    PreAuthLimit(bytes)          too many bytes before auth: drop the socket now
    ExecuteRequested(frame)      a valid execute: admit it or answer its refusal
    CancelRequested(id)          cancel an execution of this connection
    RunRequested(frame)          launch_run, stop_run or probe_runs: answer it
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass

from . import protocol

# RFC 6455 7.4.1: "1008 indicates that an endpoint is terminating the connection
# because it has received a message that violates its policy" (auth failed, a frame
# before auth).
CLOSE_POLICY_VIOLATION = 1008
# RFC 6455 7.4.1: "1001 indicates that an endpoint is 'going away', such as a server
# going down".
CLOSE_GOING_AWAY = 1001

# How much a shell reads at once after authentication.
READ_SIZE = 65536


class ServerState(enum.Enum):
    PRE_AUTH = "pre_auth"
    OPEN = "open"  # authenticated
    REFUSED = "refused"  # refused before auth; closing


@dataclass(frozen=True)
class Authenticated:
    client: str


@dataclass(frozen=True)
class Refused:
    code: str


@dataclass(frozen=True)
class PreAuthLimit:
    bytes: int


@dataclass(frozen=True)
class ExecuteRequested:
    frame: protocol.Execute


@dataclass(frozen=True)
class CancelRequested:
    id: str


@dataclass(frozen=True)
class RunRequested:
    frame: protocol.LaunchRun | protocol.StopRun | protocol.ProbeRuns


Event = Authenticated | Refused | PreAuthLimit | ExecuteRequested | CancelRequested | RunRequested


class ServerSession:
    """One client connection's conversation, seen from the host."""

    def __init__(self, *, token: str, pre_auth_max_bytes: int = protocol.PRE_AUTH_MAX_BYTES) -> None:
        self._token = token.encode()
        self.pre_auth_max_bytes = pre_auth_max_bytes
        self.state = ServerState.PRE_AUTH
        self.pre_auth_bytes = 0
        self._outbox: list[str] = []

    @property
    def authenticated(self) -> bool:
        return self.state is ServerState.OPEN

    # --- bytes ---------------------------------------------------------------------

    def read_size(self) -> int:
        """How many bytes the shell may read next: before auth at most one byte past the
        cap, so that it is crossed exactly."""
        if self.authenticated:
            return READ_SIZE
        return max(1, self.pre_auth_max_bytes - self.pre_auth_bytes + 1)

    def data_received(self, size: int) -> list[Event]:
        """Count ``size`` raw bytes read from the socket."""
        if self.authenticated:
            return []
        self.pre_auth_bytes += size
        if self.pre_auth_bytes > self.pre_auth_max_bytes:
            return [PreAuthLimit(self.pre_auth_bytes)]
        return []

    # --- frames --------------------------------------------------------------------

    def receive(self, message: str | bytes) -> list[Event]:
        """Feed one complete message from the client."""
        if self.state is ServerState.REFUSED:
            return []  # already refused: nothing this peer says changes that
        try:
            frame = protocol.decode(message)
        except protocol.ProtocolError as exc:
            if not self.authenticated:
                return self.refuse("unauthenticated", "the first frame must be a valid auth frame")
            # Bad input is answered, not punished: the connection stays open.
            self.send(protocol.Error(code=exc.code, message=exc.message, id=exc.frame_id))
            return []
        if not self.authenticated:
            return self._authenticate(frame)
        if isinstance(frame, protocol.Execute):
            if frame.timeout_ms <= 0 or frame.memory_mb <= 0:
                message = "timeout_ms and memory_mb must be positive"
                self.send(protocol.Error(code="bad_field", message=message, id=frame.id))
                return []
            return [ExecuteRequested(frame)]
        if isinstance(frame, protocol.Cancel):
            return [CancelRequested(frame.id)]
        if isinstance(frame, (protocol.LaunchRun, protocol.StopRun, protocol.ProbeRuns)):
            return [RunRequested(frame)]
        if isinstance(frame, protocol.Auth):
            self.send(protocol.Error(code="bad_field", message="this connection is already authenticated"))
        else:
            self.send(protocol.Error(code="unknown_type", message=f"a client does not send {frame.type!r} frames"))
        return []

    def refuse(self, code: str, message: str) -> list[Event]:
        """Refuse the client before authentication: an error frame, then the shell closes
        (the pre-auth byte cap keeps applying until the socket is gone)."""
        self.send(protocol.Error(code=code, message=message))
        self.state = ServerState.REFUSED
        return [Refused(code)]

    def auth_timeout(self) -> list[Event]:
        """The shell's authentication deadline passed."""
        if self.state is not ServerState.PRE_AUTH:
            return []
        return self.refuse("auth_timeout", "no valid auth frame before the deadline")

    def unknown_id(self, execution_id: str) -> None:
        """Answer a cancel that names no running execution of this connection."""
        self.send(protocol.Error(code="unknown_id", message="no running execution has this id", id=execution_id))

    def drain(self, grace_ms: int) -> None:
        """Tell an authenticated client this host takes no new work."""
        if self.authenticated:
            self.send(protocol.Draining(grace_ms=grace_ms))

    def send(self, frame: protocol.Frame) -> None:
        """Queue ``frame`` for the client."""
        if isinstance(frame, protocol.Result):
            # The raw output is capped per stream, but JSON escaping can still grow the
            # frame past what a client accepts: cut it to fit, never send it too large.
            self._outbox.append(protocol.encode_result(frame))
        else:
            self._outbox.append(protocol.encode(frame))

    def data_to_send(self) -> list[str]:
        """Frames to write, in order; each is returned once."""
        out, self._outbox = self._outbox, []
        return out

    # --- internals -----------------------------------------------------------------

    def _authenticate(self, frame: protocol.Frame) -> list[Event]:
        if not isinstance(frame, protocol.Auth):
            return self.refuse("unauthenticated", "the first frame must be auth")
        # Constant time: how much of a guess matched must not show in the timing.
        if not hmac.compare_digest(frame.token.encode(), self._token):
            return self.refuse("auth_failed", "invalid token")
        self.state = ServerState.OPEN
        return [Authenticated(frame.client[:80])]


__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_POLICY_VIOLATION",
    "Authenticated",
    "CancelRequested",
    "Event",
    "ExecuteRequested",
    "PreAuthLimit",
    "Refused",
    "RunRequested",
    "ServerSession",
    "ServerState",
]
