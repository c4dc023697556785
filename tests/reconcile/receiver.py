"""A real local HTTP server playing a run owner's callback receiver (STYLE habit 6: port
0, started by a context manager that shuts it down and joins). It answers the first
``fail_first`` POSTs of each notification id (``Holdfast-Notification-Id``) with 500,
then 200, and records what it got."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    url: str
    fail_first: int
    seen_ids: dict[str, int] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accepted(self) -> list[Received]:
        with self.lock:
            return [r for r in self.received if 200 <= r.answered < 300]

    def all(self) -> list[Received]:
        with self.lock:
            return list(self.received)


@contextlib.contextmanager
def start_receiver(fail_first: int = 0) -> Iterator[Receiver]:
    state = Receiver(url="", fail_first=fail_first)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with state.lock:
                key = self.headers.get("Holdfast-Notification-Id", "")
                state.seen_ids[key] = state.seen_ids.get(key, 0) + 1
                status = 500 if state.seen_ids[key] <= state.fail_first else 200
                state.received.append(Received(dict(self.headers.items()), body, status))
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/holdfast"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
