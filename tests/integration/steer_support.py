"""The web process as production runs it for steering: uvicorn serving controlplane.asgi
(the steer route as a long poll), on a fixed port so it can be SIGKILLed and started
again on the same port. The same life cycle as support.WebProcess."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.timing import scaled, wait_until

from .support import (
    CUT,
    FORWARD,
    ROOT,
    HttpProxy,
    WebProcess,
    _accepts,
    _reply,
    db_env_for_subprocess,
    free_port,
    read_request,
)


class AsgiWebProcess(WebProcess):
    def start(self) -> None:
        env = {**os.environ, **db_env_for_subprocess()}
        argv = [sys.executable, "-m", "uvicorn", "controlplane.asgi:application"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--no-access-log", "--timeout-graceful-shutdown", "2"]
        with open(self.log_path, "a") as log:
            self.popen = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1
        wait_until(lambda: _accepts(self.port) or self.popen.poll() is not None, timeout=30, what="web to listen")
        if self.popen.poll() is not None:
            raise AssertionError(f"web process exited:\n{self.log_path.read_text()[-2000:]}")


@contextlib.contextmanager
def start_asgi_web(log_dir: Path, port: int | None = None) -> Iterator[AsgiWebProcess]:
    web = AsgiWebProcess(port or free_port(), log_dir / "web.log")
    web.start()
    try:
        yield web
    finally:
        web.stop()


class CuttingProxy(HttpProxy):
    """An ``HttpProxy`` that decides after the backend answered: when ``cut_when(path,
    body)`` says so, the client gets the headers, half the body and a reset (the backend
    committed; its answer never arrived), and ``on_cut(path)`` is told."""

    def __init__(self, backend_port: int, cut_when, on_cut) -> None:  # type: ignore[no-untyped-def]
        super().__init__(backend_port)
        self.cut_when = cut_when
        self.on_cut = on_cut
        self.cuts: list[str] = []

    def _serve(self, sock: socket.socket) -> None:
        request = read_request(sock, timeout=scaled(60))
        if request is None:
            return
        method, path, headers, body, endpoint = request
        try:
            status, reason, response_headers, response_body = self._forward(method, path, headers, body)
        except OSError:
            self._record(method, endpoint, "backend_down")
            _reply(sock, 502, b'{"error": "backend down"}')
            return
        cut = self.cut_when(path, response_body)
        self._record(method, endpoint, CUT if cut else FORWARD)
        head = f"HTTP/1.1 {status} {reason}\r\n"
        for name, value in response_headers:
            if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                head += f"{name}: {value}\r\n"
        head += f"Content-Length: {len(response_body)}\r\nConnection: close\r\n\r\n"
        if cut:
            sock.sendall(head.encode("latin-1") + response_body[: len(response_body) // 2])
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            self.cuts.append(path)
            self.on_cut(path)
            return
        with contextlib.suppress(OSError):
            sock.sendall(head.encode("latin-1") + response_body)
