"""Real processes and a real proxy for the end-to-end run tests.

* ``WebProcess``: the control plane's web process, ``manage.py runserver --noreload``
  against the pytest-django test database, on a fixed port so it can be SIGKILLed and
  started again on the same port.
* ``HttpProxy``: a real HTTP proxy on 127.0.0.1 port 0 in front of the web process. Per
  request it forwards, answers a 502/503 itself (an outage behind a balancer), or
  forwards and then cuts the response mid-body (headers, half the body, then a TCP
  reset): the server applied the request, the client never saw the whole answer.
* ``stop_runs``: kill every run sandbox a host's state directory records (runs are
  detached, so stopping the host leaves them running).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.timing import scaled, wait_until

ROOT = Path(__file__).resolve().parents[2]


def db_env_for_subprocess() -> dict[str, str]:
    """Environment for a subprocess that must use pytest-django's test database (as
    tests/support/worker.py does)."""
    from django.db import connection

    db = connection.settings_dict
    return {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": (
            f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        "PYTHONUNBUFFERED": "1",
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class WebProcess:
    """``manage.py runserver 127.0.0.1:PORT --noreload``; its output goes to ``log_path``."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.popen: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, **db_env_for_subprocess()}
        with open(self.log_path, "a") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1
        wait_until(lambda: _accepts(self.port) or self.popen.poll() is not None, timeout=30, what="web to listen")
        if self.popen.poll() is not None:
            raise AssertionError(f"web process exited:\n{self.log_path.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: no graceful anything, as a crashed or OOM-killed web process."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=scaled(10))
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def start_web(log_dir: Path, port: int | None = None) -> Iterator[WebProcess]:
    web = WebProcess(port or free_port(), log_dir / "web.log")
    web.start()
    try:
        yield web
    finally:
        web.stop()


# --- the proxy ------------------------------------------------------------------------

FORWARD, CUT = "forward", "cut"


@dataclass
class Seen:
    method: str
    endpoint: str  # the last path segment: hello, events, ...
    action: str  # forward | cut | "502" | "503" | "backend_down"


Decide = Callable[[str, str], str]  # (method, endpoint) -> FORWARD, CUT, "502" or "503"


class HttpProxy:
    def __init__(self, backend_port: int, decide: Decide | None = None) -> None:
        self.backend_port = backend_port
        self.decide: Decide = decide or (lambda method, endpoint: FORWARD)
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def count(self, method: str | None = None, endpoint: str | None = None, action: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for s in self.seen
                if (method is None or s.method == method)
                and (endpoint is None or s.endpoint == endpoint)
                and (action is None or s.action == action)
            )

    def _serve(self, sock: socket.socket) -> None:
        request = read_request(sock, timeout=scaled(30))
        if request is None:
            return
        method, path, headers, body, endpoint = request
        action = self.decide(method, endpoint)
        if action in ("502", "503"):
            self._record(method, endpoint, action)
            _reply(sock, int(action), b'{"error": "proxy outage"}')
            return
        try:
            status, reason, response_headers, response_body = self._forward(method, path, headers, body)
        except OSError:
            self._record(method, endpoint, "backend_down")
            _reply(sock, 502, b'{"error": "backend down"}')
            return
        self._record(method, endpoint, action)
        head = f"HTTP/1.1 {status} {reason}\r\n"
        for name, value in response_headers:
            if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                head += f"{name}: {value}\r\n"
        head += f"Content-Length: {len(response_body)}\r\nConnection: close\r\n\r\n"
        if action == CUT:
            # The server has applied the request; the client gets half the body and a reset.
            sock.sendall(head.encode("latin-1") + response_body[: len(response_body) // 2])
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            return
        sock.sendall(head.encode("latin-1") + response_body)

    def _forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes):
        conn = http.client.HTTPConnection("127.0.0.1", self.backend_port, timeout=scaled(30))
        try:
            skip = ("connection", "host", "content-length")
            conn.request(method, path, body=body or None, headers={n: v for n, v in headers if n.lower() not in skip})
            response = conn.getresponse()
            return response.status, response.reason, response.getheaders(), response.read()
        except http.client.HTTPException as exc:
            raise OSError(str(exc)) from None
        finally:
            conn.close()

    def _record(self, method: str, endpoint: str, action: str) -> None:
        with self._lock:
            self.seen.append(Seen(method, endpoint, action))

    def __enter__(self) -> HttpProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _reply(sock: socket.socket, status: int, body: bytes) -> None:
    reason = {502: "Bad Gateway", 503: "Service Unavailable"}.get(status, "Error")
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(OSError):
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)


# --- run sandboxes ----------------------------------------------------------------------


def run_log(state_dir: Path, run_id: object) -> str:
    """The runner's own stdout/stderr, kept by the host in its state directory."""
    path = state_dir / "runs" / f"{run_id}.log"
    return path.read_text() if path.exists() else ""


def stop_runs(state_dir: Path) -> None:
    """SIGKILL every run sandbox the host recorded and that still runs."""
    from sandbox_host.procs import alive

    for record_path in (state_dir / "runs").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(record_path.read_text())
            pid = record.get("pid")
            # Only a sandbox the record names for sure (pid and start time), never a
            # process group of pid 1 or of a stranger that reused the pid.
            if (
                isinstance(pid, int)
                and pid > 1
                and record.get("start_time") is not None
                and alive(pid, record["start_time"])
            ):
                os.killpg(pid, signal.SIGKILL)


def wait_seconds(seconds: float) -> None:
    """A scenario's fixed duration (an outage of N seconds): not a wait for a condition,
    so it is not scaled."""
    time.sleep(seconds)


def read_request(sock: socket.socket, *, timeout: float) -> tuple[str, str, list[tuple[str, str]], bytes, str] | None:
    """One HTTP/1.1 request from ``sock``: method, path, headers, body and the runner
    API endpoint its path names; None if the client sent nothing."""
    sock.settimeout(timeout)
    reader = sock.makefile("rb")
    request_line = reader.readline().decode("latin-1").strip()
    if not request_line:
        return None
    method, path, _ = request_line.split(" ", 2)
    headers: list[tuple[str, str]] = []
    while True:
        line = reader.readline().decode("latin-1")
        if line in ("\r\n", "\n", ""):
            break
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    length = int(next((v for n, v in headers if n.lower() == "content-length"), "0") or 0)
    body = reader.read(length) if length else b""
    return method, path, headers, body, path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
