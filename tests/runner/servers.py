"""Real HTTP servers on 127.0.0.1 port 0 for the runner's transport, and an injected clock.

``scripted_server`` runs a real ``http.server`` in a thread. Each request is recorded and
answered by the next action of a script: a reply, or a response cut mid-body (headers
promising 100 bytes, one byte, then the socket destroyed), or a connection reset before any
answer. The context manager shuts the server down and joins its threads on exit.

``FakeClock`` is the injected clock and sleeper: sleeping advances it instantly and records
the wait, so no test sleeps for a budget.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None  # dict/list -> JSON; bytes as is
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CutBody:
    """Headers with Content-Length 100, one body byte, then the socket is destroyed."""

    status: int = 200


@dataclass(frozen=True)
class Reset:
    """Read the request, then close with an RST before answering (SO_LINGER 0)."""


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Action = Reply | CutBody | Reset
Responder = Callable[[Recorded], Action]


class ScriptedServer:
    def __init__(self, responder: Responder, port: int = 0) -> None:
        self.requests: list[Recorded] = []
        self._responder = responder
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Recorded(self.command, self.path, dict(self.headers.items()), body)
                with outer._lock:
                    outer.requests.append(request)
                action = outer._responder(request)
                if isinstance(action, Reset):
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if isinstance(action, CutBody):
                    self.send_response(action.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.write(b"{")
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                payload = action.body if isinstance(action.body, bytes) else json.dumps(action.body).encode()
                if action.body is None:
                    payload = b""
                self.send_response(action.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in action.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def finish(self) -> None:
                # The socket may be gone on purpose (Reset, CutBody).
                with contextlib.suppress(OSError):
                    super().finish()

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = False  # joined on close (block_on_close)

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self.httpd = Server(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


@contextlib.contextmanager
def scripted_server(responder: Responder | list[Action], port: int = 0) -> Iterator[ScriptedServer]:
    """A real server; ``responder`` is a function, or a list of actions used in order (the
    last one repeats)."""
    if isinstance(responder, list):
        script = list(responder)

        def responder_fn(request: Recorded) -> Action:
            return script.pop(0) if len(script) > 1 else script[0]

        fn: Responder = responder_fn
    else:
        fn = responder
    server = ScriptedServer(fn, port).start()
    try:
        yield server
    finally:
        server.stop()


def closed_port() -> int:
    """A port that was just bound and closed: connecting to it is refused."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeClock:
    """Injected monotonic clock and sleeper: ``sleep`` advances time at once and records it.
    ``on_sleep`` lets a test act at the exact moment the transport backs off."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[int], None] | None = None

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))
