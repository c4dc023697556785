"""A run sandbox's one way out: bytes from a Unix socket inside the sandbox to the
control plane's address, and back. Nothing else.

DESIGN.md (Runs): "a run sandbox has the same containment as an execution and its own
network namespace; its only way out is a relay to the runner API". The sandbox has no
network interface but loopback, so it cannot reach Redis, PostgreSQL, another machine
or this one's services; the relay connects to exactly one address, the one the launch
named, whatever a client inside sends. TLS (an https control plane) passes through it
untouched, so the runner verifies the control plane's certificate end to end.

One relay process per run, started by the host next to the sandbox and detached like
it: a host restart leaves both running (a restarted host starts a new relay on the same
socket path if this one is gone). It runs under the run's uid, in the run's control
groups and under its own rlimits, so it counts toward the run's limits, and exits once
the sandbox is gone.

Runs as ``python -I relay.py SPEC_JSON`` with the listening socket inherited; standard
library only; single-threaded (a selector), so it costs the run one process.
"""

from __future__ import annotations

import contextlib
import ctypes
import encodings.idna  # noqa: F401 - socket needs it for host names, after we can no longer read our venv
import errno
import json
import os
import resource
import selectors
import socket
import sys
import time
from collections.abc import Callable

# Limits
# Bytes buffered per direction of one connection before we stop reading its source.
BUFFER_BYTES = 256 * 1024
# Address space of the relay: a selector loop and a few buffers.
MEMORY_BYTES = 256 * 1024 * 1024
# Timeouts
# How often the relay looks whether its sandbox still exists.
CHECK_INTERVAL_S = 1.0
# Connecting to the control plane: a connect that has not completed by then is given up
# and the client's connection closed (the runner retries; every endpoint is replay-safe).
CONNECT_TIMEOUT_S = 10.0
# A connection with no byte either way for this long is closed: longer than any call
# the runner makes (a long poll waits 20 s at most), short enough that a job cannot
# hold the relay's connections forever.
IDLE_TIMEOUT_S = 120.0

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4


def sandbox_alive(pid: int, start_time: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and (start_time is None or int(fields[19]) == start_time)


def _confine(spec: dict) -> None:
    for procs in spec.get("cgroups", ()):
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    nofile = 2 * spec["max_connections"] + 16
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid = spec.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            raise OSError("privileges were not dropped")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


class _Side:
    def __init__(self, sock: socket.socket, *, connecting: bool = False) -> None:
        self.sock = sock
        self.outbox = bytearray()  # bytes waiting to be written to this socket
        self.read_closed = False
        self.connecting = connecting  # the upstream side, until its connect completes
        self.peer: _Side | None = None
        self.pair: _Pair | None = None


class _Pair:
    def __init__(self, client: _Side, upstream: _Side, now: float) -> None:
        self.client, self.upstream = client, upstream
        self.last_active = now
        self.connect_deadline = now + CONNECT_TIMEOUT_S
        self.closed = False


def _registered(sel: selectors.BaseSelector, sock: socket.socket) -> bool:
    try:
        sel.get_key(sock)
    except (KeyError, ValueError):
        return False
    return True


class Relay:
    """One selector loop. At ``max_connections`` it stops accepting, so further clients
    wait in the listen backlog rather than being cut; a connection idle for
    ``IDLE_TIMEOUT_S`` is closed; the connect upstream never blocks the loop."""

    def __init__(
        self,
        listener: socket.socket,
        target: tuple[str, int],
        max_connections: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.listener = listener
        self.target = target
        self.max_connections = max_connections
        self.clock = clock
        self.sel = selectors.DefaultSelector()
        self.pairs: set[_Pair] = set()
        self._listening = False
        self._update_listening()

    def _update_listening(self) -> None:
        want = len(self.pairs) < self.max_connections
        if want and not self._listening:
            self.sel.register(self.listener, selectors.EVENT_READ, None)
        elif not want and self._listening:
            self.sel.unregister(self.listener)
        self._listening = want

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        try:
            upstream = _connect_nonblocking(self.target)
        except OSError:
            client.close()  # the address does not resolve, or refuses at once
            return
        client.setblocking(False)
        a, b = _Side(client), _Side(upstream, connecting=True)
        a.peer, b.peer = b, a
        pair = _Pair(a, b, self.clock())
        a.pair = b.pair = pair
        self.pairs.add(pair)
        self._interest(a)
        self._interest(b)
        self._update_listening()

    def _interest(self, side: _Side) -> None:
        if side.sock.fileno() == -1:
            return
        peer = side.peer
        assert peer is not None
        if side.connecting:
            events = selectors.EVENT_WRITE  # writable: the connect finished, one way or the other
        else:
            events = 0
            if not side.read_closed and len(peer.outbox) < BUFFER_BYTES:
                events |= selectors.EVENT_READ
            if side.outbox:
                events |= selectors.EVENT_WRITE
        registered = _registered(self.sel, side.sock)
        if events and registered:
            self.sel.modify(side.sock, events, side)
        elif events:
            self.sel.register(side.sock, events, side)
        elif registered:
            self.sel.unregister(side.sock)

    def _close(self, pair: _Pair) -> None:
        if pair.closed:
            return
        pair.closed = True
        for one in (pair.client, pair.upstream):
            if _registered(self.sel, one.sock):
                self.sel.unregister(one.sock)
            one.sock.close()
        self.pairs.discard(pair)
        self._update_listening()

    def _pump(self, side: _Side, mask: int) -> None:
        pair, peer = side.pair, side.peer
        assert pair is not None and peer is not None
        pair.last_active = self.clock()
        if side.connecting:
            if side.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                self._close(pair)
                return
            side.connecting = False
        elif mask & selectors.EVENT_READ:
            try:
                data = side.sock.recv(65536)
            except BlockingIOError:
                data = None
            except OSError:
                self._close(pair)
                return
            if data == b"":
                side.read_closed = True
            elif data:
                peer.outbox += data
        if mask & selectors.EVENT_WRITE and side.outbox:
            try:
                sent = side.sock.send(side.outbox)
                del side.outbox[:sent]
            except BlockingIOError:
                pass
            except OSError:
                self._close(pair)
                return
        for one in (side, peer):
            # Pass a half-close on once everything before it was delivered.
            if one.peer is not None and one.peer.read_closed and not one.outbox and not one.connecting:
                with contextlib.suppress(OSError):
                    one.sock.shutdown(socket.SHUT_WR)
        if side.read_closed and peer.read_closed and not side.outbox and not peer.outbox:
            self._close(pair)
            return
        for one in (side, peer):
            self._interest(one)

    def _expire(self) -> None:
        now = self.clock()
        for pair in list(self.pairs):
            stuck = pair.upstream.connecting and now > pair.connect_deadline
            if stuck or now - pair.last_active > IDLE_TIMEOUT_S:
                self._close(pair)

    def serve(self, alive: Callable[[], bool]) -> None:
        next_check = 0.0
        while True:
            now = self.clock()
            if now >= next_check:
                if not alive():
                    return
                self._expire()
                next_check = now + CHECK_INTERVAL_S
            for key, mask in self.sel.select(timeout=CHECK_INTERVAL_S):
                if key.data is None:
                    self._accept()
                elif not key.data.pair.closed:
                    self._pump(key.data, mask)


def _connect_nonblocking(target: tuple[str, int]) -> socket.socket:
    """A socket whose connect to ``target`` is under way (or already done)."""
    family, kind, proto, _, address = socket.getaddrinfo(target[0], target[1], type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    code = sock.connect_ex(address)
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        raise OSError(code, os.strerror(code))
    return sock


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    listener = socket.socket(fileno=spec["listen_fd"])
    _confine(spec)
    pid, start = spec["sandbox"]
    relay = Relay(listener, (spec["target"][0], int(spec["target"][1])), spec["max_connections"])
    relay.serve(lambda: sandbox_alive(pid, start))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Exception as exc:  # one line, never the spec
        sys.stderr.write(f"holdfast-relay: {exc.__class__.__name__}: {exc}\n")
        sys.exit(1)
