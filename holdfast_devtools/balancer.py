"""A small TCP load balancer that deregisters targets the way an AWS ALB/NLB does.

The end-to-end drain test and ``manage.py demo_deploy`` put it in front of sandbox
hosts. Deregistering a target stops routing *new* connections to it while its open
connections keep flowing; when the deregistration delay ends, what is left is cut
(NLB ``connection_termination.enabled``). A long-lived WebSocket never drains on its
own, so the worker pool's max-age retirement is what must empty the target in time.

It pumps bytes and never parses them, so WebSocket upgrades pass through untouched.
Pure standard library with no Django import, so tests and commands can both use it.
Threads: one accepts; each connection has one thread per direction.

Errors::

    BalancerError        base of everything raised here
      UnknownTarget      a target name that was never added (or was removed); ``.name``
"""

from __future__ import annotations

import itertools
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Timeouts
# Dialing a target on a LAN or loopback takes milliseconds; past this the target is dead.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# close() waits this long per thread; longer means a pump is wedged, which is a bug.
DEFAULT_JOIN_TIMEOUT_S = 5.0
# How often deregistration() looks for an emptied target (it finishes early, like an ALB).
DEFAULT_DRAIN_POLL_S = 0.05

# Limits
# Bytes moved per recv; large enough that a 1 MiB frame takes a handful of calls.
PUMP_CHUNK_BYTES = 64 * 1024


class BalancerError(Exception):
    """Base of every error this module raises."""


class UnknownTarget(BalancerError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no target named {name!r}")
        self.name = name


@dataclass
class _Target:
    address: tuple[str, int]
    draining: bool = False
    total: int = 0
    conns: set[_Conn] = field(default_factory=set)


@dataclass(eq=False)
class _Conn:
    client: socket.socket
    opened_at: float
    upstream: socket.socket | None = None
    aborted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def abort(self) -> None:
        """Reset both sides: linger 0 makes the final close send RST, as a cut LB does;
        shutdown wakes any pump blocked in recv or send so its thread can end."""
        with self.lock:
            self.aborted = True
            for sock in (self.client, self.upstream):
                if sock is None:
                    continue
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by its peer: nothing left to cut


@dataclass(frozen=True)
class TargetSnapshot:
    address: tuple[str, int]
    draining: bool
    open: int
    total: int
    ages_s: tuple[float, ...]  # one per open connection, oldest first


@dataclass(frozen=True)
class DeregistrationReport:
    target: str
    open_at_expiry: int  # the drain test asserts 0: the pool emptied the target in time
    waited_s: float
    finished_early: bool  # the target emptied before the delay, so the LB stopped waiting


class TcpBalancer:
    def __init__(
        self, listen: tuple[str, int] = ("127.0.0.1", 0), *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    ) -> None:
        self._listen = listen
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._targets: dict[str, _Target] = {}
        self._rr = itertools.count()
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()  # lets close() interrupt select()

    # Lifecycle

    def start(self) -> TcpBalancer:
        self._listener = socket.create_server(self._listen, backlog=128)
        acceptor = threading.Thread(target=self._accept_loop, name="balancer-accept", daemon=True)
        self._threads.append(acceptor)
        acceptor.start()
        return self

    @property
    def address(self) -> tuple[str, int]:
        assert self._listener is not None, "start() first"
        host, port = self._listener.getsockname()[:2]
        return host, port

    def close(self) -> None:
        """Stop accepting, cut every connection and join every thread."""
        with self._lock:
            if self._closing:
                return  # closing twice is harmless, as for a socket
            self._closing = True
        self._wake_w.send(b"x")
        # The acceptor goes first so no connection thread can start after the cut below.
        if self._threads:
            self._threads[0].join(DEFAULT_JOIN_TIMEOUT_S)
        for name in list(self._targets):
            self.cut(name)
        leaked = []
        for thread in self._threads:
            thread.join(DEFAULT_JOIN_TIMEOUT_S)
            if thread.is_alive():
                leaked.append(thread.name)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        if leaked:
            raise BalancerError(f"threads still running after close: {leaked}")

    def __enter__(self) -> TcpBalancer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Targets

    def add_target(self, name: str, address: tuple[str, int]) -> None:
        """Register (or re-register) a target; it takes new connections at once."""
        with self._lock:
            target = self._targets.setdefault(name, _Target(address))
            target.address, target.draining = address, False

    def deregister(self, name: str) -> None:
        """No new connections go to ``name``; its open connections keep flowing."""
        with self._lock:
            self._get(name).draining = True

    def cut(self, name: str) -> int:
        """Reset every open connection to ``name`` (both sides); returns how many."""
        with self._lock:
            conns = list(self._get(name).conns)
        for conn in conns:
            conn.abort()
        return len(conns)

    def remove(self, name: str) -> None:
        """Deregister, cut what is left and forget ``name`` and its counters."""
        self.deregister(name)
        self.cut(name)
        with self._lock:
            del self._targets[name]

    # Introspection (thread-safe; the tests read these while traffic flows)

    def open_connections(self, name: str) -> int:
        with self._lock:
            return len(self._get(name).conns)

    def total_connections(self, name: str) -> int:
        with self._lock:
            return self._get(name).total

    def connections_snapshot(self) -> dict[str, TargetSnapshot]:
        now = time.monotonic()
        with self._lock:
            return {
                name: TargetSnapshot(
                    address=t.address,
                    draining=t.draining,
                    open=len(t.conns),
                    total=t.total,
                    ages_s=tuple(sorted((now - c.opened_at for c in t.conns), reverse=True)),
                )
                for name, t in self._targets.items()
            }

    # Internals

    def _get(self, name: str) -> _Target:
        try:
            return self._targets[name]
        except KeyError:
            raise UnknownTarget(name) from None

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while True:
            readable, _, _ = select.select([self._listener, self._wake_r], [], [])
            if self._wake_r in readable:
                return
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue  # the client gave up between select and accept
            opened_at = time.monotonic()
            with self._lock:
                if self._closing:
                    client.close()
                    return
                live = [(n, t) for n, t in self._targets.items() if not t.draining]
                if not live:
                    client.close()  # no registered target: accept and close, like an empty target group
                    continue
                # Round robin over registered targets only: the deregistration rule lives here.
                name, target = live[next(self._rr) % len(live)]
                conn = _Conn(client, opened_at)
                target.conns.add(conn)
                target.total += 1
                self._threads = [t for t in self._threads if t.is_alive()]
                thread = threading.Thread(
                    target=self._serve, args=(name, target, conn), name=f"balancer-{name}", daemon=True
                )
                self._threads.append(thread)
            thread.start()

    def _serve(self, name: str, target: _Target, conn: _Conn) -> None:
        """Dial the target, pump both ways, close both sockets, forget the connection.

        This thread owns the reverse pump and joins it, so close() joining the
        connection threads joins every pump too."""
        try:
            try:
                upstream = socket.create_connection(target.address, timeout=self._connect_timeout_s)
            except OSError:
                conn.abort()  # the target refused: the client sees a reset, as behind a real LB
                return
            upstream.settimeout(None)
            with conn.lock:
                conn.upstream = upstream
                was_aborted = conn.aborted
            if was_aborted:
                conn.abort()  # cut while dialing: reset the upstream we just opened too
                return
            reverse = threading.Thread(
                target=self._pump, args=(conn, upstream, conn.client), name=f"balancer-{name}-up", daemon=True
            )
            reverse.start()
            self._pump(conn, conn.client, upstream)
            reverse.join()
        finally:
            with conn.lock:  # abort() must never touch a closed (possibly reused) descriptor
                for sock in (conn.client, conn.upstream):
                    if sock is not None:
                        sock.close()
            with self._lock:
                target.conns.discard(conn)

    @staticmethod
    def _pump(conn: _Conn, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(PUMP_CHUNK_BYTES):
                dst.sendall(chunk)
        except OSError:
            conn.abort()  # a reset on one side is passed on as a reset to the other
            return
        if not conn.aborted:
            try:
                dst.shutdown(socket.SHUT_WR)  # pass the half-close on; the other direction may still flow
            except OSError:
                pass  # the other side is already gone


def deregistration(
    balancer: TcpBalancer,
    name: str,
    *,
    delay_s: float,
    on_cut: Callable[[DeregistrationReport], object] | None = None,
    finish_when_idle: bool = True,
    poll_s: float = DEFAULT_DRAIN_POLL_S,
) -> DeregistrationReport:
    """The ALB sequence: deregister now, wait up to ``delay_s``, then cut what is left.

    Blocks for up to ``delay_s``; run it in a thread to keep traffic flowing meanwhile.
    Like an ALB, it stops waiting once the target has no open connection
    (``finish_when_idle``). ``on_cut`` runs after the cut, e.g. to SIGTERM the host."""
    started = time.monotonic()
    deadline = started + delay_s
    balancer.deregister(name)
    finished_early = False
    while time.monotonic() < deadline:
        if finish_when_idle and balancer.open_connections(name) == 0:
            finished_early = True
            break
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    # Count and cut in one step, so a connection closing in between cannot be
    # reported as open yet not cut (or the reverse).
    open_at_expiry = balancer.cut(name)
    report = DeregistrationReport(name, open_at_expiry, time.monotonic() - started, finished_early)
    if on_cut is not None:
        on_cut(report)
    return report
