"""Fixtures for the host's tests: one real host process per module (starting one
probes isolation, which costs a child), and raw-socket helpers for the peers that
misbehave below the WebSocket layer."""

from __future__ import annotations

import base64
import os
import secrets
import socket
import struct

import pytest

from tests.support.host import start_host
from tests.timing import scaled

TOKEN = "hf-host-test-" + secrets.token_hex(16)


@pytest.fixture(scope="module")
def host():
    with start_host(TOKEN) as running:
        yield running


def handshake_request(port: int, *, extra_headers: str = "") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra_headers}\r\n"
    ).encode()


def raw_websocket(port: int) -> socket.socket:
    """A plain TCP socket that has completed the WebSocket handshake and nothing else."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=scaled(5))
    sock.sendall(handshake_request(port))
    response = b""
    while b"\r\n\r\n" not in response:
        chunk = sock.recv(4096)
        assert chunk, f"host closed during the handshake: {response!r}"
        response += chunk
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def frame_header(length: int, *, opcode: int = 0x1) -> bytes:
    """A masked client frame header (RFC 6455 5.2) declaring ``length`` payload bytes."""
    first = 0x80 | opcode
    if length < 126:
        head = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, length)
    return head + os.urandom(4)


def closed_by_peer(sock: socket.socket, *, within: float) -> bool:
    """True if the peer closes (EOF or reset) within ``within`` seconds; data it sends
    first (a close frame) is read and dropped."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def stream(sock: socket.socket, total: int, *, chunk: int = 16 * 1024) -> int:
    """Send up to ``total`` junk bytes; stop early when the peer has closed. Returns
    how many bytes went out."""
    sent = 0
    payload = b"\0" * chunk
    try:
        while sent < total:
            sock.sendall(payload[: min(chunk, total - sent)])
            sent += min(chunk, total - sent)
    except (ConnectionResetError, BrokenPipeError):
        pass
    return sent
