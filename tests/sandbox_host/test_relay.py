"""A run's relay in this process, against real sockets: bytes both ways to the one
target, clients past the cap wait in the backlog instead of being cut, an idle
connection is closed, and a target that never answers does not stall the others."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from sandbox_host import relay
from tests.timing import scaled

pytestmark = pytest.mark.peer


class EchoServer:
    """A TCP server on loopback that echoes what it reads, one thread per connection."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def running_relay(tmp_path, target: tuple[str, int], *, max_connections: int = 2, clock=None) -> Iterator[str]:
    path = str(tmp_path / "api.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)
    stop = threading.Event()
    kwargs = {"clock": clock} if clock else {}
    loop = relay.Relay(listener, target, max_connections, **kwargs)
    thread = threading.Thread(target=loop.serve, args=(lambda: not stop.is_set(),), daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join(scaled(5))
        listener.close()


def client(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(scaled(5))
    sock.connect(path)
    return sock


def test_bytes_go_both_ways_to_the_one_target(tmp_path):
    echo = EchoServer()
    with running_relay(tmp_path, ("127.0.0.1", echo.port)) as path:
        sock = client(path)
        payload = b"x" * 300_000  # more than one buffer's worth
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += sock.recv(65536)
        assert got == payload
        sock.close()


def test_past_the_cap_a_client_waits_and_is_served_when_a_connection_closes(tmp_path):
    echo = EchoServer()
    with running_relay(tmp_path, ("127.0.0.1", echo.port), max_connections=2) as path:
        held = [client(path), client(path)]
        for sock in held:
            sock.sendall(b"ping")
            assert sock.recv(4) == b"ping"
        waiting = client(path)  # queued in the backlog, not cut
        waiting.sendall(b"late")
        waiting.settimeout(0.3)
        with pytest.raises(TimeoutError):
            waiting.recv(4)
        held.pop().close()
        waiting.settimeout(scaled(5))
        assert waiting.recv(4) == b"late"
        for sock in (*held, waiting):
            sock.close()


def test_an_idle_connection_is_closed(tmp_path):
    echo = EchoServer()
    clock = Clock()
    with running_relay(tmp_path, ("127.0.0.1", echo.port), clock=clock) as path:
        sock = client(path)
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        clock.now += relay.IDLE_TIMEOUT_S + 1
        assert sock.recv(4) == b""  # closed by the relay at its next check
        sock.close()


def test_a_connect_that_never_completes_is_given_up_at_its_deadline(tmp_path):
    # A listener whose backlog is full: a new connect to it hangs in SYN-SENT.
    silent = socket.create_server(("127.0.0.1", 0), backlog=0)
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(silent.getsockname())
        fillers.append(filler)
    clock = Clock()
    with running_relay(tmp_path, silent.getsockname(), max_connections=4, clock=clock) as path:
        stuck = client(path)
        stuck.sendall(b"hello")
        stuck.settimeout(0.3)
        with pytest.raises(TimeoutError):
            stuck.recv(1)  # still connecting: the loop is not blocked, it keeps waiting
        clock.now += relay.CONNECT_TIMEOUT_S + 1
        stuck.settimeout(scaled(5))
        assert stuck.recv(1) == b""  # given up at the deadline, the client's socket closed
        stuck.close()
    for sock in (*fillers, silent):
        sock.close()
