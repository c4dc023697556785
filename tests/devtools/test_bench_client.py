"""The benchmarks' host client times P1 the way the issue defines it (frame in, result
frame out), so its own frame reader must read what a host sends exactly: any message it
misreads would be a figure in docs/benchmarks.md that means something else."""

from __future__ import annotations

import secrets
import time

import pytest
from websockets.frames import Frame, Opcode

from bench.host_speed import HostClient, ServerFrames
from tests.support.host import start_host


def server_frame(payload: bytes, opcode: Opcode = Opcode.TEXT, *, mask: bool = False) -> bytes:
    """A frame as the host's WebSocket library writes it (a server's: unmasked)."""
    return Frame(opcode, payload).serialize(mask=mask, extensions=[])


# Each length form of RFC 6455: 7 bits, 16 bits (126), 64 bits (127).
MESSAGES = [b'{"type":"started"}', b"x" * 300, b"y" * 70_000]


def test_every_length_form_is_read_whole_however_the_bytes_arrive():
    stream = b"".join(server_frame(message) for message in MESSAGES)
    assert ServerFrames().feed(stream) == MESSAGES
    frames, read = ServerFrames(), []
    for i in range(len(stream)):  # one byte at a time: every header cut at every point
        read += frames.feed(stream[i : i + 1])
    assert read == MESSAGES
    assert frames.buffer == b""


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(server_frame(b"{}", Opcode.BINARY), id="binary"),
        pytest.param(server_frame(b"{}", mask=True), id="masked"),
        pytest.param(server_frame(b"", Opcode.PING), id="ping"),
        # Refused at its first two bytes, not once a length it misread has arrived.
        pytest.param(server_frame(b"x" * 300, mask=True)[:2], id="masked-header-alone"),
    ],
)
def test_a_frame_it_does_not_expect_stops_the_bench(frame):
    with pytest.raises(SystemExit, match="does not expect"):
        ServerFrames().feed(frame)


@pytest.mark.peer
def test_the_host_side_is_timed_between_the_frame_written_and_the_result_read():
    token = "hf-bench-test-" + secrets.token_hex(16)
    with start_host(token) as host:
        client = HostClient(host.url, token)
        try:
            before = time.monotonic()
            sent, received = client.exchange("print(1)", clock=time.monotonic)
            after = time.monotonic()
            assert before <= sent < received <= after
            # The connection is left as websocket-client expects it: nothing half read.
            client.execute("print(2)")
            assert client.host_side("print(3)") > 0
        finally:
            client.close()
