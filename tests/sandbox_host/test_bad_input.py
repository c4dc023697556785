"""Issue 2, test 5: bad input gets a clear error frame or close, never a crash, and the
host keeps serving other clients."""

from __future__ import annotations

import json
import socket
import struct

import pytest
import websocket

from holdfast_wire import protocol
from tests.support.host import connect, execute, recv_frame, send_frame
from tests.timing import scaled

from .conftest import TOKEN, closed_by_peer, handshake_request

pytestmark = pytest.mark.peer


def close_code(ws: websocket.WebSocket) -> int | None:
    """Read frames until the peer's close frame and return its code."""
    while True:
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return struct.unpack("!H", frame.data[:2])[0] if len(frame.data) >= 2 else None


def assert_serves_others(host) -> None:
    other = connect(host.url, TOKEN)
    try:
        assert execute(other, "print(6 * 7)").stdout == "42\n"
    finally:
        other.close()


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{not json", "malformed_json"),
        ("[1, 2]", "not_an_object"),
        ('{"v": 1, "type": "teleport", "id": "x1"}', "unknown_type"),
        ('{"v": 1, "type": "execute", "id": "x1", "code": "1", "timeout_ms": "soon", "memory_mb": 64}', "bad_field"),
        ('{"v": 1, "type": "execute", "id": "x1", "code": "1", "memory_mb": 64}', "missing_field"),
        ('{"v": 1, "type": "execute", "id": "x1", "code": "1", "timeout_ms": 0, "memory_mb": 64}', "bad_field"),
        ('{"v": 1, "type": "cancel", "id": "nothing-runs"}', "unknown_id"),
        ('{"v": 1, "type": "result", "id": "x1", "status": "succeeded"}', "unknown_type"),
    ],
)
def test_bad_frames_after_auth_get_an_error_frame_and_the_connection_stays_open(host, text, code):
    ws = connect(host.url, TOKEN)
    try:
        ws.send(text)
        answer = recv_frame(ws)
        assert isinstance(answer, protocol.Error) and answer.code == code, answer
        # The same connection still works.
        assert execute(ws, "print('ok')").stdout == "ok\n"
    finally:
        ws.close()


def test_a_newer_client_may_add_fields_the_host_ignores(host):
    ws = connect(host.url, TOKEN)
    try:
        body = json.loads(
            protocol.encode(protocol.Execute(id="newer-1", code="print(1)", timeout_ms=5000, memory_mb=128))
        )
        body.update(v=2, priority="high")
        ws.send(json.dumps(body))
        assert recv_frame(ws) == protocol.Started(id="newer-1")
        assert recv_frame(ws).stdout == "1\n"
    finally:
        ws.close()


def test_a_wrong_token_gets_auth_failed_then_close_1008(host):
    ws = websocket.create_connection(host.url, timeout=scaled(5))
    try:
        send_frame(ws, protocol.Auth(token="wrong-" + TOKEN, client="intruder"))
        answer = recv_frame(ws)
        assert isinstance(answer, protocol.Error) and answer.code == "auth_failed"
        assert close_code(ws) == 1008
    finally:
        ws.close()
    assert "wrong-" not in host.log() and TOKEN not in host.log()
    assert_serves_others(host)


def test_a_frame_other_than_auth_first_gets_unauthenticated_then_close(host):
    ws = websocket.create_connection(host.url, timeout=scaled(5))
    try:
        send_frame(ws, protocol.Execute(id="sneaky", code="print(1)", timeout_ms=1000, memory_mb=64))
        answer = recv_frame(ws)
        assert isinstance(answer, protocol.Error) and answer.code == "unauthenticated"
        assert close_code(ws) == 1008
    finally:
        ws.close()
    assert "sneaky" not in host.log()  # nothing was admitted, let alone run
    assert_serves_others(host)


def test_malformed_json_before_auth_gets_unauthenticated_then_close(host):
    ws = websocket.create_connection(host.url, timeout=scaled(5))
    try:
        ws.send("{garbage")
        answer = recv_frame(ws)
        assert isinstance(answer, protocol.Error) and answer.code == "unauthenticated"
        assert close_code(ws) == 1008
    finally:
        ws.close()
    assert_serves_others(host)


def test_an_oversize_frame_after_auth_is_closed_with_1009(host):
    ws = connect(host.url, TOKEN, timeout=scaled(10))
    try:
        ws.send("x" * (protocol.MAX_FRAME_BYTES + 1))
        assert close_code(ws) == 1009
    finally:
        ws.close()
    assert_serves_others(host)


def test_a_frame_at_the_limit_after_auth_is_accepted(host):
    ws = connect(host.url, TOKEN, timeout=scaled(10))
    try:
        prefix = protocol.encode(protocol.Execute(id="big-1", code="", timeout_ms=5000, memory_mb=128))
        padding = protocol.MAX_FRAME_BYTES - len(prefix.encode())
        code = "#" + "a" * (padding - 1)  # a comment: the snippet does nothing
        text = protocol.encode(protocol.Execute(id="big-1", code=code, timeout_ms=5000, memory_mb=128))
        assert len(text.encode()) == protocol.MAX_FRAME_BYTES
        ws.send(text)
        assert recv_frame(ws) == protocol.Started(id="big-1")
        assert recv_frame(ws).status == "succeeded"
    finally:
        ws.close()


def test_bytes_that_are_not_http_before_auth_are_closed(host):
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=scaled(5))
    try:
        sock.sendall(b"\x16\x03\x01 this is not a websocket handshake\r\n\r\n")
        assert closed_by_peer(sock, within=scaled(5))
    finally:
        sock.close()
    assert_serves_others(host)


def test_websocket_pings_are_answered(host):
    ws = connect(host.url, TOKEN)
    try:
        ws.ping(b"are-you-there")
        opcode, frame = ws.recv_data_frame(True)
        assert opcode == websocket.ABNF.OPCODE_PONG and frame.data == b"are-you-there"
    finally:
        ws.close()


def test_an_incomplete_handshake_is_refused_when_it_grows_past_the_cap(host):
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=scaled(5))
    try:
        try:
            sock.sendall(handshake_request(host.port)[:-2] + b"X-Junk: " + b"z" * (protocol.PRE_AUTH_MAX_BYTES))
        except (ConnectionResetError, BrokenPipeError):
            pass
        assert closed_by_peer(sock, within=scaled(1))
    finally:
        sock.close()
    assert_serves_others(host)
