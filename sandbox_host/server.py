"""The host: a listening socket, one thread per connection, and the SIGTERM drain.

Run sandboxes (``runs.py``) are detached: the drain refuses new launches but never waits
on or touches a running run; only executions are waited for.

Drain, in order (DESIGN.md, Host): stop accepting (the listening socket is closed, so
new connections are refused by the kernel); refuse new executions with
``not_started(draining)`` before any process exists; tell every authenticated client
``draining``; let in-flight executions finish within the grace period and kill what is
left after it (their results are still sent); close every connection with 1001; return,
and the process exits 0.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import select
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass

from . import defaults
from .connection import CLOSE_GOING_AWAY, Connection
from .executions import Admission
from .isolation import Isolation
from .log import log
from .reserve import Reserve
from .runs import RunLimits, RunSandboxes, default_state_dir
from .workers import Workers


@dataclass(frozen=True)
class Settings:
    # Timeouts
    auth_timeout_s: float = defaults.DEFAULT_AUTH_TIMEOUT_S
    drain_grace_s: float = defaults.DEFAULT_DRAIN_GRACE_S
    close_timeout_s: float = defaults.DEFAULT_CLOSE_TIMEOUT_S
    send_timeout_s: float = defaults.DEFAULT_SEND_TIMEOUT_S
    poll_interval_s: float = defaults.DEFAULT_POLL_INTERVAL_S
    # Limits
    max_concurrent: int = defaults.DEFAULT_MAX_CONCURRENT
    max_runs: int = defaults.DEFAULT_MAX_RUNS
    max_pre_auth: int = defaults.DEFAULT_MAX_PRE_AUTH
    max_pre_auth_per_peer: int = defaults.DEFAULT_MAX_PRE_AUTH_PER_PEER
    reserve: int = defaults.DEFAULT_RESERVE_SIZE
    reserve_quiet_s: float = defaults.DEFAULT_RESERVE_QUIET_S
    # Where run records live; empty means the default per host id under the temp dir.
    state_dir: str = ""


class Host:
    def __init__(
        self,
        *,
        listener: socket.socket,
        token: str,
        host_id: str,
        isolation: Isolation,
        settings: Settings,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.listener = listener
        # With a context, every accepted socket speaks TLS (wss://); the handshake runs in
        # the connection's thread, so a slow peer never holds the accept loop.
        self.tls = tls
        self.token = token
        self.host_id = host_id
        self.isolation = isolation
        self.settings = settings
        reserve_size = settings.reserve if isolation.sandboxed else 0
        self.admission = Admission(settings.max_concurrent, spare=reserve_size)
        self.workers = Workers()
        self.reserve = (
            Reserve(
                reserve_size,
                isolation=isolation,
                take_slot=self.admission.take_slot,
                return_slot=self.admission.return_slot,
                quiet_s=settings.reserve_quiet_s,
            )
            if reserve_size
            else None
        )
        self.runs = RunSandboxes(
            state_dir=settings.state_dir or default_state_dir(host_id),
            isolation=isolation,
            draining=lambda: self.admission.draining,
            limits=RunLimits(max_runs=settings.max_runs),
        )
        self.runs.adopt()
        self.runs.prune()
        self.drain_requested = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[Connection] = set()
        self._authenticated: set[Connection] = set()
        self._draining = False
        self._ids = itertools.count(1)
        # Connections not yet authenticated, and how many per peer address (DESIGN.md:
        # a cap on unauthenticated connections applies).
        self._pre_auth: set[Connection] = set()
        self._pre_auth_per_peer: collections.Counter[str] = collections.Counter()
        self.pre_auth_refused = 0
        self._refused_logged_at = 0.0

    # --- connection registry -----------------------------------------------------

    def mark_authenticated(self, conn: Connection) -> bool:
        """Register ``conn`` for drain notices; returns whether the host is draining.
        Under the same lock as the drain's snapshot, so no client misses both the
        ``draining`` flag in ``auth_ok`` and the ``draining`` frame."""
        with self._lock:
            self._authenticated.add(conn)
            self._leave_pre_auth(conn)
            return self._draining

    def forget(self, conn: Connection) -> None:
        with self._lock:
            self._connections.discard(conn)
            self._authenticated.discard(conn)
            self._leave_pre_auth(conn)

    def _leave_pre_auth(self, conn: Connection) -> None:
        # Caller holds self._lock.
        if conn in self._pre_auth:
            self._pre_auth.discard(conn)
            address = _address(conn.peer)
            self._pre_auth_per_peer[address] -= 1
            if self._pre_auth_per_peer[address] <= 0:
                del self._pre_auth_per_peer[address]

    def _admit(self, address: str) -> str:
        """Why a new connection from ``address`` is refused, or "" to take it. Caller
        holds self._lock."""
        if len(self._pre_auth) >= self.settings.max_pre_auth:
            return "pre_auth_cap"
        if self._pre_auth_per_peer[address] >= self.settings.max_pre_auth_per_peer:
            return "pre_auth_peer_cap"
        return ""

    def _refuse_connection(self, sock: socket.socket, address: str, reason: str) -> None:
        """Close at once, with a reset and without a thread or a byte read: refusing
        must cost less than the peer spends asking. Logged at most once a second."""
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        self.pre_auth_refused += 1
        now = time.monotonic()
        if now - self._refused_logged_at >= 1.0:
            self._refused_logged_at = now
            log("connection_refused", reason=reason, peer=address, refused_total=self.pre_auth_refused)

    # --- serving -----------------------------------------------------------------

    def serve(self) -> None:
        """Accept connections until a drain is requested, then drain and return."""
        self.listener.setblocking(False)
        while not self.drain_requested.is_set():
            readable, _, _ = select.select([self.listener], [], [], self.settings.poll_interval_s)
            if not readable:
                continue
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            with self._lock:
                refusal = self._admit(addr[0])
                if not refusal:
                    if self.tls is not None:
                        sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                    conn = Connection(self, sock, f"{addr[0]}:{addr[1]}", f"c{next(self._ids)}")
                    self._connections.add(conn)
                    self._pre_auth.add(conn)
                    self._pre_auth_per_peer[addr[0]] += 1
            if refusal:
                self._refuse_connection(sock, addr[0], refusal)
                continue
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            log("connection_opened", conn=conn.id, peer=conn.peer)
            conn.thread.start()
        self.drain()

    def drain(self) -> None:
        grace_s = self.settings.drain_grace_s
        # Closing the listener first: from here the kernel refuses new connections.
        self.listener.close()
        self.admission.start_draining()
        with self._lock:
            self._draining = True
            notify = list(self._authenticated)
        in_flight = self.admission.in_flight()
        log("draining_started", grace_ms=int(grace_s * 1000), connections=len(notify), in_flight=in_flight)
        for conn in notify:
            conn.drain(int(grace_s * 1000))
        if self.reserve is not None:
            # Nothing new starts here: let the waiting sandboxes go (after the clients
            # were told, so tearing them down delays no one's news).
            self.reserve.close()
        killed = 0
        if not self.admission.wait_idle(grace_s):
            killed = self.admission.in_flight()
            error = f"Execution was killed: the sandbox host's drain grace of {grace_s:g} s ran out"
            self.admission.stop_all("failed", error)
            self.admission.wait_idle(self.settings.close_timeout_s + 5)
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            conn.close(CLOSE_GOING_AWAY, "host draining")
        deadline = time.monotonic() + self.settings.close_timeout_s + 1
        for conn in conns:
            conn.thread.join(max(0.0, deadline - time.monotonic()))
        log("draining_finished", killed=killed, connections_closed=len(conns))


def _address(peer: str) -> str:
    """The address part of a ``host:port`` peer string (IPv6 addresses hold colons)."""
    return peer.rsplit(":", 1)[0]
