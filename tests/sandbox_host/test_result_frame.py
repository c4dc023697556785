"""A result frame always fits the frame limit once encoded: JSON escaping grows output
about six times (``\\x01`` becomes ``\\u0001``), so the host cuts the streams to fit
rather than send a frame a client must refuse."""

from __future__ import annotations

import json

import pytest

from controlplane.pool import wsclient
from holdfast_wire import protocol as p
from tests.support.host import new_id, recv_frame, send_frame, start_host
from tests.timing import scaled

pytestmark = pytest.mark.peer

MIB = 1024 * 1024


def encoded_size(frame: p.Frame) -> int:
    return len(p.encode(frame).encode())


def test_a_result_that_fits_is_unchanged():
    frame = p.Result(id="a", status="succeeded", exit_code=0, stdout="x" * 1000, stderr="\x01" * 1000)
    assert p.fit_result(frame) is frame


@pytest.mark.parametrize(
    ("stdout", "fits"),
    [("1\n", True), ("\x01" * 300_000, True), ("é" * (p.MAX_RESULT_FRAME_BYTES // 2 - 200), True),
     ("é" * (p.MAX_RESULT_FRAME_BYTES // 2), False), ("\x01" * MIB, False)],
)  # fmt: skip
def test_the_result_s_text_is_the_text_of_the_result_cut_to_fit(stdout, fits):
    # What the host sends (encode_result, which skips the cut when the frame surely fits).
    frame = p.Result(id="a", status="succeeded", exit_code=0, stdout=stdout, stderr="")
    text = p.encode_result(frame)
    assert text == p.encode(p.fit_result(frame))
    assert len(text.encode()) <= p.MAX_RESULT_FRAME_BYTES
    assert (text == p.encode(frame)) is fits


def test_escaped_output_is_cut_until_the_encoded_frame_fits():
    frame = p.Result(id="a", status="succeeded", exit_code=0, stdout="\x01" * 3 * MIB, stderr="\x02" * MIB)
    assert encoded_size(frame) > 6 * p.MAX_RESULT_FRAME_BYTES
    fitted = p.fit_result(frame)
    assert encoded_size(fitted) <= p.MAX_RESULT_FRAME_BYTES
    marker = p.RESULT_TRUNCATED_MARKER.format(limit=p.MAX_RESULT_FRAME_BYTES)
    for stream, kept in ((frame.stdout, fitted.stdout), (frame.stderr, fitted.stderr)):
        assert kept.endswith(marker)
        body = kept[: -len(marker)]
        assert stream.startswith(body)
        # Each stream gets about half the frame: at 6 bytes a character, ~87k characters.
        assert len(body) > p.MAX_RESULT_FRAME_BYTES // 2 // 6 - 100
    assert json.loads(p.encode(fitted))["exit_code"] == 0


def test_a_short_stream_lends_its_share_to_the_long_one():
    frame = p.Result(id="a", status="failed", exit_code=1, stdout="ok\n", stderr="\x01" * MIB)
    fitted = p.fit_result(frame)
    assert fitted.stdout == "ok\n"
    assert encoded_size(fitted) <= p.MAX_RESULT_FRAME_BYTES
    assert len(fitted.stderr) > p.MAX_RESULT_FRAME_BYTES // 6 - 200


def test_a_real_host_sends_escaped_output_within_the_frame_limit(sandbox_token):
    """3 MiB of ``\\x01`` (capped to 1 MiB raw by the host) once made a 6 MB frame; a
    client with a receive limit of MAX_RESULT_FRAME_BYTES now gets the result."""
    with start_host(sandbox_token) as host:
        ws = wsclient.create_connection(host.url, timeout=scaled(10))
        try:
            send_frame(ws, p.Auth(token=sandbox_token, client="tests"))
            assert isinstance(recv_frame(ws), p.AuthOk)
            execution_id = new_id()
            code = "import sys\nsys.stdout.write('\\x01' * 3 * 1024 * 1024)\n"
            send_frame(ws, p.Execute(id=execution_id, code=code, timeout_ms=20_000, memory_mb=256))
            while not isinstance(frame := recv_frame(ws), p.Result):
                pass
        finally:
            ws.close()
    assert frame.status == "succeeded"
    assert frame.stdout.startswith("\x01" * 100_000)
    assert frame.stdout.endswith(p.RESULT_TRUNCATED_MARKER.format(limit=p.MAX_RESULT_FRAME_BYTES))


def test_two_full_streams_of_plain_text_are_never_cut_twice():
    full = p.truncate_output("x" * (2 * p.MAX_OUTPUT_BYTES))
    frame = p.Result(id="a", status="succeeded", exit_code=0, stdout=full, stderr=full)
    assert p.fit_result(frame) is frame
