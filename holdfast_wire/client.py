"""The client side of a session with a sandbox host, without I/O.

Every control-plane caller that talks to a host (the executions pool, the launch
driver, the reconcile prober) is a thin shell around one ``ClientSession``: it writes
the texts the session returns, feeds it every message it reads, and acts on the events
it gets back. The session holds the rules of the conversation (docs/protocol.md):

* auth first: ``connect()`` gives the ``auth`` frame, and nothing else may be sent
  before the host's ``auth_ok``; a host below ``required_isolation`` is refused before
  anything is sent to it (DESIGN.md, Containment);
* requests are pending by id (``ref`` for ``probe_runs``) until the host answers them;
  an answer naming no pending request is not ours and is dropped;
* ``draining`` (in ``auth_ok``, as a frame, or as a ``not_started`` reason) means take
  no new work here: ``HostDraining``, once, and the shell retires the connection;
* ``not_started`` means the request provably never ran there (the host created nothing
  for it, or its sandboxes died before reading the code, even after ``started``):
  ``Movable``, the caller may send it elsewhere;
* ``result`` (and the run answers) resolve their request: ``Answered``;
* a frame this release cannot read (an unknown type, a field of the wrong shape) is
  ignored, so a host of release N+1 can add frames (compatibility N-1 <-> N);
* a connection lost with requests pending leaves each one ``Dropped``: it may have run.

Events::

    Authenticated(auth_ok)        the host accepted us; requests may be sent
    AuthRefused(reason)           the host refused us, or we refuse it; nothing was sent
    HostDraining(grace_ms, ...)   take no new work on this connection
    Answered(id, frame)           a request's answer (result, run_*, or an error naming it)
    Movable(id, frame)            not_started: it provably never ran
    HostError(frame)              an error frame naming no request
    Ignored(code)                 a frame this release cannot read
    Dropped(id)                   the connection closed with the request unanswered

Errors::

    SessionError                  a caller broke the session's rules (a bug, not the host)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from . import protocol


class ClientState(enum.Enum):
    CONNECTING = "connecting"  # nothing sent yet
    AUTHENTICATING = "authenticating"  # auth sent, no answer yet
    OPEN = "open"  # auth_ok received: requests may be sent
    CLOSED = "closed"  # refused, or the connection is gone


class SessionError(Exception):
    """The caller broke a session rule (sent before auth, reused a pending id)."""


# --- events ------------------------------------------------------------------------


@dataclass(frozen=True)
class Authenticated:
    auth_ok: protocol.AuthOk


@dataclass(frozen=True)
class AuthRefused:
    reason: str
    host_id: str = ""
    # True when the host authenticated us but its isolation is below what we require.
    isolation: bool = False


@dataclass(frozen=True)
class HostDraining:
    grace_ms: int = 0
    # How we learned it: "auth_ok", "draining" (the frame) or "not_started".
    source: str = "draining"


@dataclass(frozen=True)
class Answered:
    id: str
    frame: protocol.Frame


@dataclass(frozen=True)
class Movable:
    id: str
    frame: protocol.NotStarted


@dataclass(frozen=True)
class HostError:
    frame: protocol.Error


@dataclass(frozen=True)
class Ignored:
    code: str


@dataclass(frozen=True)
class Dropped:
    id: str


Event = Authenticated | AuthRefused | HostDraining | Answered | Movable | HostError | Ignored | Dropped

# Requests the host answers, and the field of the request that names the answer.
_ANSWERED_BY = {
    protocol.Execute: "id",
    protocol.LaunchRun: "id",
    protocol.StopRun: "id",
    protocol.ProbeRuns: "ref",
}
# Answers, and the field that names their request.
_ANSWERS = {
    protocol.Result: "id",
    protocol.RunLaunched: "id",
    protocol.RunStopped: "id",
    protocol.RunStatus: "ref",
}


class ClientSession:
    """One connection's conversation, seen from the client."""

    def __init__(self, *, token: str, client: str, required_isolation: str | None = protocol.FULL_ISOLATION) -> None:
        """``required_isolation=None`` accepts any level (a probe sends nothing secret
        and must see every host that may hold runs)."""
        self._token = token
        self.client = client
        self.required_isolation = required_isolation
        self.state = ClientState.CONNECTING
        self.auth_ok: protocol.AuthOk | None = None
        self.draining = False
        self._pending: dict[str, protocol.Frame] = {}

    @property
    def host_id(self) -> str:
        return self.auth_ok.host_id if self.auth_ok is not None else ""

    @property
    def pending(self) -> Mapping[str, protocol.Frame]:
        """Requests sent and not yet answered, by id (a read-only view)."""
        return MappingProxyType(self._pending)

    # --- output ------------------------------------------------------------------

    def connect(self) -> str:
        """The ``auth`` frame: the first and, until ``auth_ok``, the only thing to send."""
        if self.state is not ClientState.CONNECTING:
            raise SessionError(f"connect() in state {self.state.value}")
        self.state = ClientState.AUTHENTICATING
        return protocol.encode(protocol.Auth(token=self._token, client=self.client))

    def send(self, frame: protocol.Frame) -> str:
        """The text of a request; a request the host answers is pending from now on.
        ``cancel`` is answered through the execution it names, so it adds nothing."""
        if self.state is not ClientState.OPEN:
            raise SessionError(f"cannot send {frame.type} in state {self.state.value}")
        key_field = _ANSWERED_BY.get(type(frame))
        if key_field is not None:
            key = getattr(frame, key_field)
            if key in self._pending:
                raise SessionError(f"{frame.type} {key!r} is already pending")
            self._pending[key] = frame
        elif not isinstance(frame, protocol.Cancel):
            raise SessionError(f"a client does not send {frame.type} frames")
        return protocol.encode(frame)

    def forget(self, key: str) -> protocol.Frame | None:
        """The caller is done with ``key`` (answered, given up): stop expecting it."""
        return self._pending.pop(key, None)

    # --- input -------------------------------------------------------------------

    def receive(self, message: str | bytes) -> list[Event]:
        """Feed one message read from the host; returns what it means."""
        if self.state is ClientState.CLOSED:
            return []
        try:
            frame = protocol.decode(message)
        except protocol.ProtocolError as exc:
            if self.state is not ClientState.OPEN:
                return [self._refuse(f"unreadable answer to auth ({exc.code})")]
            return [Ignored(exc.code)]  # a newer host's frame: not for this release
        if self.state is not ClientState.OPEN:
            return self._authenticate(frame)
        return self._receive_open(frame)

    def connection_lost(self) -> list[Event]:
        """The socket is gone: whatever was pending may have reached the host."""
        self.state = ClientState.CLOSED
        dropped, self._pending = list(self._pending), {}
        return [Dropped(key) for key in dropped]

    # --- internals ---------------------------------------------------------------

    def _authenticate(self, frame: protocol.Frame) -> list[Event]:
        if isinstance(frame, protocol.Error):
            return [self._refuse(f"authentication refused ({frame.code}: {frame.message[:80]})")]
        if not isinstance(frame, protocol.AuthOk):
            return [self._refuse(f"authentication refused ({frame.type})")]
        if self.required_isolation is not None:
            # DESIGN.md (Containment): refuse a host below the required level before
            # anything is sent to it.
            refusal = protocol.isolation_refusal(frame.isolation, self.required_isolation)
            if refusal:
                self.state = ClientState.CLOSED
                return [AuthRefused(f"host {frame.host_id}: {refusal}", host_id=frame.host_id, isolation=True)]
        self.state = ClientState.OPEN
        self.auth_ok = frame
        # A host that got SIGTERM before we authenticated says so in auth_ok.
        return [Authenticated(frame), *(self._heard_draining(0, "auth_ok") if frame.draining else [])]

    def _refuse(self, reason: str) -> AuthRefused:
        self.state = ClientState.CLOSED
        return AuthRefused(reason)

    def _receive_open(self, frame: protocol.Frame) -> list[Event]:
        if isinstance(frame, protocol.Draining):
            return self._heard_draining(frame.grace_ms, "draining")
        if isinstance(frame, protocol.NotStarted):
            if self._pending.pop(frame.id, None) is None:
                return []
            events: list[Event] = []
            if frame.reason == "draining":
                # Its draining frame may still be on the way; this answer says the same.
                events += self._heard_draining(0, "not_started")
            return [*events, Movable(frame.id, frame)]
        if isinstance(frame, protocol.Error):
            if frame.id is None:
                return [HostError(frame)]
            if self._pending.pop(frame.id, None) is None:
                return []
            return [Answered(frame.id, frame)]
        key_field = _ANSWERS.get(type(frame))
        if key_field is None:
            return []  # started, or anything a client need not act on
        key = getattr(frame, key_field)
        if self._pending.pop(key, None) is None:
            return []  # not ours (an answer to a request we already gave up)
        return [Answered(key, frame)]

    def _heard_draining(self, grace_ms: int, source: str) -> list[Event]:
        if self.draining:
            return []
        self.draining = True
        return [HostDraining(grace_ms, source)]


__all__ = [
    "Answered",
    "AuthRefused",
    "Authenticated",
    "ClientSession",
    "ClientState",
    "Dropped",
    "Event",
    "HostDraining",
    "HostError",
    "Ignored",
    "Movable",
    "SessionError",
]
