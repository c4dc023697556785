"""The wire protocol, fed strings: no sockets (STYLE habit 1)."""

from __future__ import annotations

import json

import pytest

from holdfast_wire import protocol as p

EVERY_FRAME = [
    p.Auth(token="t0ken", client="worker pid=1"),
    p.Execute(id="e-1", code="print(1)", timeout_ms=1000, memory_mb=64),
    p.Cancel(id="e-1"),
    p.AuthOk(host_id="h1", draining=True),
    p.Started(id="e-1"),
    p.Result(id="e-1", status="failed", exit_code=1, stdout="o", stderr="e", duration_ms=5, error="x"),
    p.NotStarted(id="e-1", reason="draining"),
    p.Draining(grace_ms=60_000),
    p.Error(code="bad_field", message="m", id="e-1"),
    p.LaunchRun(id="r-1", key="hfl_k", control_plane_url="http://cp:8000"),
    p.RunLaunched(id="r-1", already=True),
    p.StopRun(id="r-1"),
    p.RunStopped(id="r-1", was_running=True),
    p.ProbeRuns(ids=["r-1", "r-2"], ref="p"),
    p.RunStatus(statuses={"r-1": {"status": "running", "exit_code": None}}, ref="p"),
]


@pytest.mark.parametrize("frame", EVERY_FRAME, ids=lambda f: f.type)
def test_every_frame_round_trips(frame):
    text = p.encode(frame)
    body = json.loads(text)
    assert body["v"] == p.PROTOCOL_VERSION and body["type"] == frame.type
    assert p.decode(text) == frame
    assert p.decode(text.encode()) == frame


def test_unknown_fields_are_ignored_so_a_newer_sender_can_add_them():
    text = '{"v": 7, "type": "cancel", "id": "e-1", "reason": "new in v7"}'
    assert p.decode(text) == p.Cancel(id="e-1")


def test_optional_fields_take_their_defaults():
    assert p.decode('{"type": "result", "id": "e-1", "status": "succeeded"}') == p.Result(id="e-1", status="succeeded")


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{nope", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        ("[]", "not_an_object"),
        ('"auth"', "not_an_object"),
        ('{"id": "e-1"}', "missing_field"),
        ('{"type": 3}', "missing_field"),
        ('{"type": "warp"}', "unknown_type"),
        ('{"type": "auth"}', "missing_field"),
        ('{"type": "auth", "token": 5}', "bad_field"),
        ('{"type": "execute", "id": "a", "code": "", "timeout_ms": true, "memory_mb": 1}', "bad_field"),
        ('{"type": "execute", "id": "a", "code": "", "timeout_ms": 1.5, "memory_mb": 1}', "bad_field"),
        ('{"type": "cancel", "id": "has space"}', "bad_field"),
        ('{"type": "cancel", "id": ""}', "bad_field"),
        ('{"type": "cancel", "id": "' + "a" * (p.MAX_ID_CHARS + 1) + '"}', "bad_field"),
    ],
)
def test_bad_frames_raise_protocol_error_with_a_code(text, code):
    with pytest.raises(p.ProtocolError) as caught:
        p.decode(text)
    assert caught.value.code == code
    assert caught.value.code in p.ERROR_CODES


def test_an_error_names_the_execution_when_the_frame_carried_a_valid_id():
    with pytest.raises(p.ProtocolError) as caught:
        p.decode('{"type": "execute", "id": "e-9", "code": "", "timeout_ms": "x", "memory_mb": 1}')
    assert caught.value.frame_id == "e-9"


def test_the_auth_frame_never_prints_its_token():
    assert "t0ken" not in repr(p.Auth(token="t0ken"))


def test_the_longest_valid_id_is_accepted():
    assert p.decode('{"type": "cancel", "id": "' + "a" * p.MAX_ID_CHARS + '"}').id == "a" * p.MAX_ID_CHARS


def test_output_under_the_cap_is_untouched():
    assert p.truncate_output("abc", 3) == "abc"


def test_output_over_the_cap_is_cut_and_marked():
    assert p.truncate_output("abcdef", 3) == "abc" + p.OUTPUT_TRUNCATED_MARKER.format(limit=3)


def test_truncation_never_splits_a_multibyte_character():
    cut = p.truncate_output("é" * 4, 3)  # 8 bytes; 3 would split the second "é"
    assert cut == "é" + p.OUTPUT_TRUNCATED_MARKER.format(limit=3)


def test_every_status_and_error_code_is_a_known_constant():
    assert {"succeeded", "failed", "timed_out", "cancelled"} == p.RESULT_STATUSES
    assert {"auth_failed", "unauthenticated", "duplicate_id", "unknown_type"} <= p.ERROR_CODES


def test_a_launch_never_prints_its_key():
    frame = p.LaunchRun(id="r-1", key="hfl_secret_key", control_plane_url="http://cp")
    assert "hfl_secret_key" not in repr(frame) and "hfl_secret_key" not in str(frame)


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "launch_run", "id": "r", "key": "", "control_plane_url": "http://cp"}',
        '{"type": "launch_run", "id": "r", "key": "a b", "control_plane_url": "http://cp"}',
        '{"type": "launch_run", "id": "r", "key": "k", "control_plane_url": "ftp://cp"}',
        '{"type": "probe_runs", "ids": ["ok", 7]}',
        '{"type": "probe_runs", "ids": ["../x"]}',
        '{"type": "probe_runs", "ids": "r-1"}',
    ],
)
def test_run_frames_with_bad_fields_are_refused(text):
    with pytest.raises(p.ProtocolError) as caught:
        p.decode(text)
    assert caught.value.code in ("bad_field", "missing_field")


def test_a_probe_is_bounded():
    ids = [f"r{i}" for i in range(p.MAX_PROBE_IDS + 1)]
    with pytest.raises(p.ProtocolError):
        p.decode(json.dumps({"type": "probe_runs", "ids": ids}))
    assert len(p.decode(json.dumps({"type": "probe_runs", "ids": ids[:-1]})).ids) == p.MAX_PROBE_IDS
