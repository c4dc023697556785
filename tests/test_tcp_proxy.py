"""The outage tests' TCP proxy (tests/support/tcp_proxy.py) against a real server: while
it refuses, connects are refused and its port stays its own, so a test session running
beside (``dev.py test`` runs two) cannot take it and break ``restore``."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.peer


def _echo_server() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server


def _round_trip(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"ping")
        return conn.recv(1024)


def test_a_refusing_proxy_keeps_its_port_and_forwards_again_on_it_after_restore():
    server = _echo_server()
    try:
        with TcpProxy(server.getsockname()) as proxy:
            assert _round_trip(proxy.port) == b"ping"
            proxy.refuse()
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            # Bound: the kernel gives a bound port to no port-0 bind and no connect's
            # ephemeral port, and refuses a plain bind to it.
            other = socket.socket()
            with other, pytest.raises(OSError, match="Address already in use"):
                other.bind(("127.0.0.1", proxy.port))
            proxy.restore()
            assert _round_trip(proxy.port) == b"ping"
    finally:
        server.close()
