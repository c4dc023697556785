"""A real sandbox host process for tests (STYLE habit 6: real servers on port 0, started
by a context manager that shuts them down and joins on exit), plus a tiny synchronous
client built on websocket-client. The process itself is ``holdfast_devtools``'s.

    with start_host(token) as host:
        ws = connect(host.url, token)
        result = execute(ws, "print(1)")
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import websocket

from holdfast_devtools import processes
from holdfast_devtools.processes import HostProcess, busy_descendants, descendants
from holdfast_wire import protocol
from holdfast_wire.client import ClientSession
from tests.timing import scaled

__all__ = ["ROOT", "SHARED_LEVEL", "HostProcess", "busy_descendants", "descendants", "share", "start_host"]

ROOT = processes.ROOT


@contextlib.contextmanager
def start_host(
    token: str,
    *,
    host_id: str | None = None,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] | list[str] = (),
) -> Iterator[HostProcess]:
    """Run a host on 127.0.0.1 port 0 until the block ends, then stop it and join
    (``holdfast_devtools.processes``, the launcher the demos and the benchmarks use)."""
    host = processes.start_host(token, host_id=host_id, env=env, extra_args=extra_args, timeout_s=scaled(30))
    try:
        yield host
    finally:
        host.stop(timeout=scaled(20))


# The level a host started with ``share`` reports: pools in those tests must accept it.
SHARED_LEVEL = "insecure-shared-dir"


def share(directory) -> tuple[str, ...]:
    """Host arguments that bind ``directory`` read-write into every sandbox, so a test can
    count how often a snippet really ran. Test harnesses only: it breaks containment, and
    the host reports ``SHARED_LEVEL``, which the test's pool must be told to accept."""
    return ("--insecure-shared-dir", str(directory))


# --- a tiny sync client ---------------------------------------------------------------


def connect(url: str, token: str, *, timeout: float | None = None, client: str = "tests") -> websocket.WebSocket:
    """Open a WebSocket to ``url``, authenticate, and return it. Fails on anything but
    ``auth_ok``; the ``auth_ok`` frame is kept on the socket as ``ws.auth_ok``."""
    # The control plane's client session, accepting any level: tests check the host.
    session = ClientSession(token=token, client=client, required_isolation=None)
    ws = websocket.create_connection(url, timeout=timeout or scaled(10))
    ws.send(session.connect())
    events = session.receive(ws.recv())
    if session.auth_ok is None:
        ws.close()
        raise AssertionError(f"expected auth_ok, got {events!r}")
    ws.auth_ok = session.auth_ok
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
