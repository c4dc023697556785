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
import json
import os
import resource
import selectors
import socket
import sys
import time

# Limits
# Bytes buffered per direction of one connection before we stop reading its source.
BUFFER_BYTES = 256 * 1024
# Address space of the relay: a selector loop and a few buffers.
MEMORY_BYTES = 256 * 1024 * 1024
# Timeouts
# How often the relay looks whether its sandbox still exists.
CHECK_INTERVAL_S = 1.0
# Connecting to the control plane: a refused or hung connect closes the client's
# socket, which the runner's transport treats as nothing sent.
CONNECT_TIMEOUT_S = 10.0

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
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.outbox = bytearray()  # bytes waiting to be written to this socket
        self.read_closed = False
        self.peer: _Side | None = None


def _registered(sel: selectors.BaseSelector, sock: socket.socket) -> bool:
    try:
        sel.get_key(sock)
    except KeyError:
        return False
    return True


class Relay:
    def __init__(self, listener: socket.socket, target: tuple[str, int], max_connections: int) -> None:
        self.listener = listener
        self.target = target
        self.max_connections = max_connections
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, None)
        self.pairs = 0

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        if self.pairs >= self.max_connections:
            client.close()  # at the cap: the runner's transport retries a refused connect
            return
        try:
            upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT_S)
        except OSError:
            client.close()
            return
        client.setblocking(False)
        upstream.setblocking(False)
        a, b = _Side(client), _Side(upstream)
        a.peer, b.peer = b, a
        self.pairs += 1
        for side in (a, b):
            self.sel.register(side.sock, selectors.EVENT_READ, side)

    def _interest(self, side: _Side) -> None:
        if side.sock.fileno() == -1:
            return
        events = 0
        if not side.read_closed and side.peer is not None and len(side.peer.outbox) < BUFFER_BYTES:
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

    def _close(self, side: _Side) -> None:
        for one in (side, side.peer):
            if one is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(one.sock)
            one.sock.close()
        self.pairs -= 1

    def _pump(self, side: _Side, mask: int) -> None:
        peer = side.peer
        assert peer is not None
        if mask & selectors.EVENT_READ:
            try:
                data = side.sock.recv(65536)
            except BlockingIOError:
                data = None
            except OSError:
                self._close(side)
                return
            if data == b"":
                side.read_closed = True
                if not peer.outbox:
                    with contextlib.suppress(OSError):
                        peer.sock.shutdown(socket.SHUT_WR)
            elif data:
                peer.outbox += data
        if mask & selectors.EVENT_WRITE and side.outbox:
            try:
                sent = side.sock.send(side.outbox)
                del side.outbox[:sent]
            except BlockingIOError:
                pass
            except OSError:
                self._close(side)
                return
            if not side.outbox and peer.read_closed:
                with contextlib.suppress(OSError):
                    side.sock.shutdown(socket.SHUT_WR)
        if side.read_closed and peer.read_closed and not side.outbox and not peer.outbox:
            self._close(side)
            return
        for one in (side, peer):
            self._interest(one)

    def serve(self, alive) -> None:
        next_check = 0.0
        while True:
            now = time.monotonic()
            if now >= next_check:
                if not alive():
                    return
                next_check = now + CHECK_INTERVAL_S
            for key, mask in self.sel.select(timeout=CHECK_INTERVAL_S):
                if key.data is None:
                    self._accept()
                elif key.fileobj.fileno() != -1:
                    self._pump(key.data, mask)


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
