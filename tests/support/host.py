"""A real sandbox host process for tests (STYLE habit 6: real servers on port 0, started
by a context manager that shuts them down and joins on exit), plus a tiny synchronous
client built on websocket-client.

    with start_host(token) as host:
        ws = connect(host.url, token)
        result = execute(ws, "print(1)")
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import websocket

from holdfast_wire import protocol
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"^holdfast-host listening (wss?://(\S+):(\d+)) host_id=(\S+) isolation=(\S+)$")


class HostProcess:
    """A running ``python -m sandbox_host``. Its stderr (the structured log) is collected
    by a thread so the host never blocks on a full pipe."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.url = ""
        self.port = 0
        self.host_id = ""
        self.isolation = ""
        self.stdout_lines: list[str] = []
        self.log_lines: list[str] = []
        self._listening = threading.Event()
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            line = line.rstrip("\n")
            self.stdout_lines.append(line)
            found = LISTENING.match(line)
            if found and not self._listening.is_set():
                self.url, self.port, self.host_id = found.group(1), int(found.group(3)), found.group(4)
                self.isolation = found.group(5)
                self._listening.set()
        self._listening.set()  # exited before listening: let the waiter see it

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.log_lines.append(line.rstrip("\n"))

    def wait_listening(self, timeout: float) -> None:
        if not self._listening.wait(timeout) or not self.url:
            self.kill()
            raise RuntimeError("sandbox host did not start:\n" + self.log())

    def log(self) -> str:
        return "\n".join(self.log_lines)

    def terminate(self) -> None:
        """SIGTERM: the host drains and exits 0."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the host and whatever children it had (they would outlive it)."""
        stragglers = descendants(self.pid)
        if self.popen.poll() is None:
            self.popen.kill()
        for pid in stragglers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self) -> int:
        self.terminate()
        try:
            self.popen.wait(timeout=scaled(20))
        except subprocess.TimeoutExpired:
            self.kill()
            self.popen.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()
        return self.popen.returncode


@contextlib.contextmanager
def start_host(
    token: str,
    *,
    host_id: str | None = None,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] | list[str] = (),
) -> Iterator[HostProcess]:
    """Run a host on 127.0.0.1 port 0 until the block ends, then stop it and join."""
    argv = [sys.executable, "-m", "sandbox_host", "--listen", "127.0.0.1:0"]
    if host_id:
        argv += ["--host-id", host_id]
    argv += list(extra_args)
    child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    child_env["HOLDFAST_SANDBOX_TOKEN"] = token
    if env and "HOLDFAST_SANDBOX_TOKEN" in env:  # a test of the empty-token refusal
        child_env["HOLDFAST_SANDBOX_TOKEN"] = env["HOLDFAST_SANDBOX_TOKEN"]
    popen = subprocess.Popen(argv, cwd=ROOT, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    host = HostProcess(popen)
    try:
        host.wait_listening(scaled(30))
        yield host
    finally:
        host.stop()


# The level a host started with ``share`` reports: pools in those tests must accept it.
SHARED_LEVEL = "insecure-shared-dir"


def share(directory) -> tuple[str, ...]:
    """Host arguments that bind ``directory`` read-write into every sandbox, so a test can
    count how often a snippet really ran. Test harnesses only: it breaks containment, and
    the host reports ``SHARED_LEVEL``, which the test's pool must be told to accept."""
    return ("--insecure-shared-dir", str(directory))


def busy_descendants(pid: int) -> list[int]:
    """``descendants`` less the sandboxes the host keeps prepared, waiting for code."""
    busy = []
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                if b"/holdfast/waiter.py" in fh.read().split(b"\0"):
                    continue
        except OSError:
            continue
        busy.append(child)
    return busy


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may hold spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


# --- a tiny sync client ---------------------------------------------------------------


def connect(url: str, token: str, *, timeout: float | None = None, client: str = "tests") -> websocket.WebSocket:
    """Open a WebSocket to ``url``, authenticate, and return it. Fails on anything but
    ``auth_ok``; the ``auth_ok`` frame is kept on the socket as ``ws.auth_ok``."""
    ws = websocket.create_connection(url, timeout=timeout or scaled(10))
    ws.send(protocol.encode(protocol.Auth(token=token, client=client)))
    answer = recv_frame(ws)
    if not isinstance(answer, protocol.AuthOk):
        ws.close()
        raise AssertionError(f"expected auth_ok, got {answer!r}")
    ws.auth_ok = answer
    return ws


def send_frame(ws: websocket.WebSocket, frame: protocol.Frame) -> None:
    ws.send(protocol.encode(frame))


def recv_frame(ws: websocket.WebSocket) -> protocol.Frame:
    return protocol.decode(ws.recv())


def new_id() -> str:
    return uuid.uuid4().hex


def execute(
    ws: websocket.WebSocket, code: str, *, timeout_ms: int = 10_000, memory_mb: int = 256, id: str | None = None
) -> protocol.Frame:
    """Send one execute and return its answer: a ``result`` (after its ``started``),
    or a ``not_started``/``error`` if the host refused it. Other executions' frames on
    the same socket are not expected here."""
    execution_id = id or new_id()
    send_frame(ws, protocol.Execute(id=execution_id, code=code, timeout_ms=timeout_ms, memory_mb=memory_mb))
    while True:
        frame = recv_frame(ws)
        if isinstance(frame, protocol.Started | protocol.Draining):
            continue
        return frame
