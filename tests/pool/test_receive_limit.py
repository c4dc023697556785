"""The worker's WebSocket client has a receive limit: a host that sends a message larger
than the frame limit gets its connection closed before the payload is buffered, and what
was in flight is interrupted (it may have run), never accepted."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from controlplane.pool.connection import HostConnection
from controlplane.pool.outcome import ExecRequest
from holdfast_wire import protocol
from tests.support.scripted import scripted_host
from tests.timing import scaled

pytestmark = pytest.mark.peer


@contextlib.contextmanager
def oversized_host(stdout_bytes: int) -> Iterator[str]:
    """A scripted host, named as such: it authenticates anyone and answers every execute
    with a result whose stdout is ``stdout_bytes`` long."""

    def handler(ws) -> None:
        ws.recv()
        ws.send(protocol.encode(protocol.AuthOk(host_id="oversized", isolation=protocol.FULL_ISOLATION)))
        for message in ws:
            frame = protocol.decode(message)
            ws.send(
                protocol.encode(
                    protocol.Result(id=frame.id, status="succeeded", exit_code=0, stdout="x" * stdout_bytes)
                )
            )

    with scripted_host(handler, max_size=None) as url:
        yield url


def run_one(url: str) -> tuple[protocol.Frame | None, bool]:
    conn = HostConnection(url, max_age_s=60, limit=4, on_change=lambda: None)
    conn.connect("t", timeout_s=scaled(5), client="tests")
    try:
        pending = conn.dispatch(ExecRequest(id=uuid.uuid4().hex, code="print(1)", timeout_ms=1000, memory_mb=64))
        assert pending is not None
        assert pending.done.wait(scaled(10))
        return pending.frame, pending.dropped
    finally:
        conn.close("test over")


def test_a_message_over_the_frame_limit_closes_the_connection_and_interrupts():
    with oversized_host(protocol.MAX_RESULT_FRAME_BYTES + 1) as url:
        frame, dropped = run_one(url)
    assert frame is None and dropped  # the pool reports a drop as interrupted


def test_a_message_within_the_limit_is_accepted():
    with oversized_host(protocol.MAX_RESULT_FRAME_BYTES - 200) as url:
        frame, dropped = run_one(url)
    assert isinstance(frame, protocol.Result) and not dropped
