"""Unauthenticated connections are capped host-wide and per peer address: the excess is
refused at once (no thread, no byte read), and authenticated work keeps being served."""

from __future__ import annotations

import contextlib
import socket
import time

import pytest

from holdfast_wire import protocol
from tests.support.host import connect, execute, start_host
from tests.timing import scaled, wait_until

pytestmark = pytest.mark.peer


def silent(source: str, port: int) -> socket.socket:
    """A connection that never sends a byte, from ``source`` (any 127/8 address works)."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.settimeout(scaled(5))
    return sock


def refused(sock: socket.socket) -> bool:
    """The host closed this connection without a word (EOF or reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("Threads:")).split()[1])


def test_pre_auth_connections_over_the_caps_are_refused_and_authenticated_work_goes_on(sandbox_token):
    args = ("--max-pre-auth", "12", "--max-pre-auth-per-peer", "8", "--auth-timeout-s", "30")
    with start_host(sandbox_token, extra_args=args) as host, contextlib.ExitStack() as stack:
        worker = connect(host.url, sandbox_token)  # authenticated before the flood
        stack.callback(worker.close)
        # An execution first: the thread that ran it waits for the next one (workers.py),
        # so the count below is of connection threads only.
        assert execute(worker, "print('warm')").stdout == "warm\n"
        baseline = threads(host.pid)
        first_peer = [silent("127.0.0.2", host.port) for _ in range(8)]
        for sock in first_peer:
            stack.callback(sock.close)
        wait_until(lambda: threads(host.pid) >= baseline + 8, timeout=10, what="8 connection threads")
        # The ninth from the same peer is refused at once.
        extra = silent("127.0.0.2", host.port)
        stack.callback(extra.close)
        assert refused(extra)
        # Another peer gets the rest of the host-wide budget (12), then is refused too.
        second_peer = [silent("127.0.0.3", host.port) for _ in range(4)]
        for sock in second_peer:
            stack.callback(sock.close)
        wait_until(lambda: threads(host.pid) >= baseline + 12, timeout=10, what="12 connection threads")
        over = silent("127.0.0.4", host.port)
        stack.callback(over.close)
        assert refused(over)
        assert all(not refused_now(sock) for sock in first_peer + second_peer)
        # No thread was spent on the refused ones.
        time.sleep(0.3)
        assert threads(host.pid) <= baseline + 12
        # The authenticated connection is served throughout.
        result = execute(worker, "print('still served')")
        assert isinstance(result, protocol.Result) and result.stdout == "still served\n"
        # Authenticating frees a pre-auth slot: a new client gets in once one leaves.
        first_peer.pop().close()
        wait_until(lambda: threads(host.pid) <= baseline + 11, timeout=10, what="a slot to free")
        late = connect(host.url, sandbox_token)
        stack.callback(late.close)
        assert isinstance(execute(late, "print(2)"), protocol.Result)
    assert "connection_refused" in host.log()


def refused_now(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return refused(sock)
    finally:
        sock.settimeout(scaled(5))
