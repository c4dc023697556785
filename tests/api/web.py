"""The web process as production runs it (uvicorn serving controlplane.asgi) against the
test database, with settings of a test's choosing, and two clients a service might be:
one that drops its connection mid-answer, and a server-sent-events reader."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.integration.support import ROOT, WebProcess, _accepts, db_env_for_subprocess, free_port
from tests.timing import scaled, wait_until


class ApiWebProcess(WebProcess):
    def __init__(self, port: int, log_path: Path, env: dict[str, str]) -> None:
        super().__init__(port, log_path)
        self.env = env

    def start(self) -> None:
        env = {**os.environ, **db_env_for_subprocess(), **self.env}
        argv = [sys.executable, "-m", "uvicorn", "controlplane.asgi:application"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--no-access-log", "--timeout-graceful-shutdown", "2"]
        with open(self.log_path, "a") as log:
            self.popen = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(lambda: _accepts(self.port) or self.popen.poll() is not None, timeout=30, what="web to listen")
        if self.popen.poll() is not None:
            raise AssertionError(f"web process exited:\n{self.log_path.read_text()[-2000:]}")

    def threads(self) -> int:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise AssertionError("no Threads line")


@contextlib.contextmanager
def start_api_web(log_dir: Path, **env: str) -> Iterator[ApiWebProcess]:
    web = ApiWebProcess(free_port(), log_dir / "web.log", env)
    web.start()
    try:
        yield web
    finally:
        web.stop()


def post_and_drop(port: int, path: str, body: dict, headers: dict[str, str], keep_bytes: int) -> bytes:
    """POST, read the first ``keep_bytes`` of the answer, then reset the connection: the
    server has done the work; the client never saw the answer (its id travels in the
    Location header as well as the body, so the cut must come before both)."""
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(payload)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    sock = socket.create_connection(("127.0.0.1", port), timeout=scaled(30))
    try:
        sock.sendall(head.encode() + payload)
        seen = b""
        while len(seen) < keep_bytes:
            chunk = sock.recv(keep_bytes - len(seen))
            if not chunk:
                break
            seen += chunk
        return seen
    finally:
        # RST, not FIN: the way a client killed mid-read leaves.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def request(port: int, method: str, path: str, body: dict | None = None, headers: dict[str, str] | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(30))
    try:
        data = json.dumps(body).encode() if body is not None else None
        sent = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=sent)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


class EventStream:
    """A server-sent-events client: ``next()`` returns one message as a dict of its
    fields (id, event, data, retry), or None at the end of the stream."""

    def __init__(self, port: int, path: str, headers: dict[str, str]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(30))
        self.conn.request("GET", path, headers=headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}
        self.comments = 0

    def next(self) -> dict[str, str] | None:
        fields: dict[str, str] = {}
        while True:
            line = self.response.readline()
            if not line:
                return None
            line = line.decode().rstrip("\n")
            if line == "":
                if fields:
                    return fields
                continue
            if line.startswith(":"):
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value

    def events(self, count: int) -> list[dict]:
        """The next ``count`` run events (data decoded), skipping the preamble."""
        out = []
        while len(out) < count:
            message = self.next()
            assert message is not None, f"the stream ended after {out}"
            if "data" in message and message.get("event") is None:
                assert message["id"] == str(json.loads(message["data"])["seq"])
                out.append(json.loads(message["data"]))
        return out

    def close(self) -> None:
        self.conn.close()
