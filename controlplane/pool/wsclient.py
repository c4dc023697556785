"""websocket-client with a receive limit, and ``dial``: connect and authenticate a
client session, the one way every control-plane caller opens a host connection.

websocket-client reads whatever length a frame header announces (up to 2**63 bytes)
and joins continuation frames without bound, so a faulty or hostile host could make a
worker buffer gigabytes. Hosts never send a message larger than
``protocol.MAX_RESULT_FRAME_BYTES`` (a result is cut to fit, ``protocol.fit_result``); this
client refuses one that is, before reading its payload, by raising
``websocket.WebSocketProtocolException`` like any other protocol violation. Every
WebSocket the control plane opens to a host goes through ``create_connection`` here.
"""

from __future__ import annotations

import ssl
from typing import Any

import websocket
from websocket._abnf import continuous_frame, frame_buffer

from holdfast_wire import client, protocol

# Largest message accepted from a host, in bytes: the largest a host sends.
MAX_RECEIVE_BYTES = protocol.MAX_RESULT_FRAME_BYTES


class TooLarge(websocket.WebSocketProtocolException):
    """The host announced a message larger than MAX_RECEIVE_BYTES."""


class _LimitedFrameBuffer(frame_buffer):
    max_size = MAX_RECEIVE_BYTES

    def recv_length(self) -> None:
        super().recv_length()
        if self.length is not None and self.length > self.max_size:
            raise TooLarge(f"frame of {self.length} bytes exceeds the {self.max_size}-byte receive limit")


class _LimitedContinuation(continuous_frame):
    max_size = MAX_RECEIVE_BYTES

    def add(self, frame) -> None:
        held = len(self.cont_data[1]) if self.cont_data else 0
        if held + len(frame.data) > self.max_size:
            raise TooLarge(f"message exceeds the {self.max_size}-byte receive limit")
        super().add(frame)


class LimitedWebSocket(websocket.WebSocket):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        skip = kwargs.get("skip_utf8_validation", False)
        self.frame_buffer = _LimitedFrameBuffer(self._recv, skip)
        self.cont_frame = _LimitedContinuation(kwargs.get("fire_cont_frame", False), skip)


def tls_options() -> dict[str, Any]:
    """Certificate verification for ``wss://``: always on (certificate and host name),
    against HOLDFAST_SANDBOX_CA_BUNDLE when set (a private CA), else the system's CAs."""
    from django.conf import settings

    options: dict[str, Any] = {"cert_reqs": ssl.CERT_REQUIRED, "check_hostname": True}
    if settings.SANDBOX_CA_BUNDLE:
        options["ca_certs"] = settings.SANDBOX_CA_BUNDLE
    return options


def create_connection(url: str, **options: Any) -> websocket.WebSocket:
    """``websocket.create_connection`` with the receive limit, and for ``wss://`` URLs
    certificate verification (``tls_options``)."""
    if url.startswith("wss://"):
        options.setdefault("sslopt", tls_options())
    return websocket.create_connection(url, class_=LimitedWebSocket, **options)


class DialFailed(Exception):
    """Connecting or authenticating failed: nothing but ``auth`` was sent. ``refusal``
    is the session's verdict when the host answered (a wrong token, a level below the
    required isolation)."""

    def __init__(self, reason: str, *, refusal: client.AuthRefused | None = None) -> None:
        super().__init__(reason)
        self.refusal = refusal


def dial(
    url: str, session: client.ClientSession, *, timeout_s: float, **options: Any
) -> tuple[websocket.WebSocket, list[client.Event]]:
    """Connect to ``url`` and authenticate ``session`` on it: the socket (its timeout
    still ``timeout_s``) and the session's events for ``auth_ok`` (``Authenticated``,
    maybe ``HostDraining``), or ``DialFailed``."""
    try:
        ws = create_connection(url, timeout=timeout_s, **options)
    except Exception as exc:  # any failure to connect is a failed connect, nothing more
        raise DialFailed(f"connect: {describe(exc)}") from None
    try:
        ws.send(session.connect())
        events = session.receive(ws.recv())
    except (OSError, websocket.WebSocketException, UnicodeDecodeError) as exc:
        ws.shutdown()
        raise DialFailed(f"auth: {describe(exc)}") from None
    refusal = next((e for e in events if isinstance(e, client.AuthRefused)), None)
    if refusal is not None:
        ws.shutdown()
        raise DialFailed(refusal.reason, refusal=refusal)
    return ws, events


def describe(exc: BaseException) -> str:
    """The class and the first line of the reason, bounded: a handshake error's text can
    carry response headers, and nothing here may echo a frame or the URL."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{exc.__class__.__name__}: {text}"[:120] if text else exc.__class__.__name__
