"""The test balancer behaves like an AWS ALB/NLB deregistering a target.

Real sockets on 127.0.0.1 port 0 and real echo servers in threads; no Django, no DB."""

from __future__ import annotations

import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from holdfast_devtools.balancer import DeregistrationReport, TcpBalancer, UnknownTarget, deregistration
from tests.timing import scaled, wait_until

pytestmark = pytest.mark.peer


class EchoServer:
    """A real TCP server: greets each connection with ``<name>\\n``, echoes what it gets,
    and on the client's half-close answers ``bye`` and closes (to see half-closes pass)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self.address: tuple[str, int] = self._listener.getsockname()[:2]

    def __enter__(self) -> EchoServer:
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(scaled(5))
        self._listener.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=f"echo-{self.name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            if select.select([self._listener], [], [], 0.05)[0]:
                conn, _ = self._listener.accept()
                self._conns.append(conn)
                self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.sendall(self.name.encode() + b"\n")
                while data := conn.recv(65536):
                    conn.sendall(data)
                conn.sendall(b"bye")
            except OSError:
                pass


def connect(balancer: TcpBalancer) -> tuple[socket.socket, str]:
    """Open a client connection through the balancer; return it and the target's name."""
    sock = socket.create_connection(balancer.address, timeout=scaled(5))
    greeting = b""
    while not greeting.endswith(b"\n"):
        chunk = sock.recv(1)
        assert chunk, "the balancer closed the connection before the target greeted"
        greeting += chunk
    return sock, greeting[:-1].decode()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"EOF after {len(data)} of {n} bytes"
        data += chunk
    return data


def sees_close(sock: socket.socket) -> bool:
    """The client observes the connection gone: EOF or a reset."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def assert_round_trip(sock: socket.socket, size: int = 1024 * 1024) -> None:
    payload = os.urandom(size)  # arbitrary bytes: the balancer must not parse anything
    # Send from a thread: a 1 MiB echo would otherwise deadlock on full socket buffers.
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(sock.sendall, payload)
        assert recv_exact(sock, size) == payload
        sent.result()


@contextmanager
def balanced_pair() -> Iterator[tuple[TcpBalancer, EchoServer, EchoServer]]:
    with EchoServer("a") as a, EchoServer("b") as b, TcpBalancer() as balancer:
        balancer.add_target("a", a.address)
        balancer.add_target("b", b.address)
        yield balancer, a, b


def test_new_connections_are_spread_round_robin_across_targets() -> None:
    with balanced_pair() as (balancer, _, _):
        clients = [connect(balancer) for _ in range(6)]
        assert sorted(name for _, name in clients) == ["a"] * 3 + ["b"] * 3
        assert (balancer.total_connections("a"), balancer.total_connections("b")) == (3, 3)
        assert (balancer.open_connections("a"), balancer.open_connections("b")) == (3, 3)
        for sock, _ in clients:
            sock.close()
        wait_until(lambda: balancer.open_connections("a") + balancer.open_connections("b") == 0, what="closes")
        assert balancer.total_connections("a") == 3  # ever accepted, not currently open


def test_deregistered_target_gets_no_new_connections_but_its_open_ones_keep_flowing() -> None:
    with balanced_pair() as (balancer, _, _):
        old, name = connect(balancer)
        assert name == "a"
        balancer.deregister("a")
        fresh = [connect(balancer) for _ in range(4)]
        assert [name for _, name in fresh] == ["b"] * 4
        assert balancer.total_connections("a") == 1
        assert_round_trip(old)  # both ways, 1 MiB, after deregistration
        assert balancer.open_connections("a") == 1


def test_cut_resets_every_open_connection_to_the_target_and_only_those() -> None:
    with balanced_pair() as (balancer, _, _):
        (a1, _), (b1, _), (a2, _) = (connect(balancer) for _ in range(3))
        balancer.deregister("a")
        assert balancer.cut("a") == 2
        assert sees_close(a1) and sees_close(a2)
        wait_until(lambda: balancer.open_connections("a") == 0, what="cut connections forgotten")
        assert_round_trip(b1, 1024)  # the other target's connection is untouched


def test_a_half_close_passes_through_and_the_reply_still_arrives() -> None:
    with balanced_pair() as (balancer, _, _):
        sock, _ = connect(balancer)
        sock.shutdown(socket.SHUT_WR)
        assert recv_exact(sock, 3) == b"bye"  # the target saw our EOF and could still answer
        assert sock.recv(1) == b""  # then its close reached us as a clean EOF
        wait_until(lambda: balancer.open_connections("a") == 0, what="half-closed connection forgotten")


def test_with_no_registered_target_a_connection_is_accepted_and_closed() -> None:
    with EchoServer("a") as a, TcpBalancer() as balancer:
        balancer.add_target("a", a.address)
        balancer.deregister("a")
        sock = socket.create_connection(balancer.address, timeout=scaled(5))
        assert sees_close(sock)
        assert balancer.total_connections("a") == 0


def test_a_refusing_target_resets_the_client_and_leaves_nothing_open() -> None:
    dead = socket.create_server(("127.0.0.1", 0))
    address = dead.getsockname()[:2]
    dead.close()  # nothing listens there now: the dial is refused
    with TcpBalancer() as balancer:
        balancer.add_target("dead", address)
        try:
            sock = socket.create_connection(balancer.address, timeout=scaled(5))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the reset came before connect() had returned: the same reset, sooner
        else:
            with sock:
                assert sees_close(sock)
        wait_until(lambda: balancer.open_connections("dead") == 0, what="refused connection forgotten")


def test_deregistration_cuts_survivors_at_expiry_and_reports_them() -> None:
    with balanced_pair() as (balancer, _, _):
        old, _ = connect(balancer)
        seen: list[DeregistrationReport] = []
        report = deregistration(balancer, "a", delay_s=0.3, on_cut=seen.append)
        assert (report.open_at_expiry, report.finished_early) == (1, False)
        assert seen == [report]
        assert sees_close(old)
        assert connect(balancer)[1] == "b"


def test_deregistration_finishes_early_once_the_target_has_emptied() -> None:
    with balanced_pair() as (balancer, _, _):
        old, _ = connect(balancer)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(deregistration, balancer, "a", delay_s=scaled(10))
            wait_until(lambda: balancer.connections_snapshot()["a"].draining, what="deregistered")
            assert_round_trip(old, 1024)  # still flowing while draining
            old.close()  # the pool retires its connection before the delay ends
            report = running.result(timeout=scaled(10))
        assert (report.open_at_expiry, report.finished_early) == (0, True)


def test_snapshot_lists_open_counts_and_ages_per_target() -> None:
    with balanced_pair() as (balancer, _, _):
        clients = [connect(balancer) for _ in range(3)]
        balancer.deregister("b")
        snap = balancer.connections_snapshot()
        assert (snap["a"].open, snap["a"].total, snap["a"].draining) == (2, 2, False)
        assert (snap["b"].open, snap["b"].draining) == (1, True)
        assert len(snap["a"].ages_s) == 2 and all(age >= 0 for age in snap["a"].ages_s)
        assert list(snap["a"].ages_s) == sorted(snap["a"].ages_s, reverse=True)  # oldest first
        for sock, _ in clients:
            sock.close()


def test_remove_cuts_and_forgets_a_target_and_unknown_names_raise() -> None:
    with balanced_pair() as (balancer, _, _):
        sock, _ = connect(balancer)
        balancer.remove("a")
        assert sees_close(sock)
        assert "a" not in balancer.connections_snapshot()
        with pytest.raises(UnknownTarget) as raised:
            balancer.open_connections("a")
        assert raised.value.name == "a"


def test_close_resets_clients_and_joins_every_thread() -> None:
    with EchoServer("a") as a:
        balancer = TcpBalancer().start()
        balancer.add_target("a", a.address)
        clients = [connect(balancer)[0] for _ in range(3)]
        clients[0].shutdown(socket.SHUT_WR)  # one half-closed, two fully open
        balancer.close()
        # Checked at once, without waiting: close() itself must have joined them.
        assert [t.name for t in threading.enumerate() if t.name.startswith("balancer-")] == []
        assert all(sees_close(sock) for sock in clients[1:])
        balancer.close()  # a second close is harmless
