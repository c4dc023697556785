"""The server session, fed bytes counts and frames: no sockets (STYLE habit 1)."""

from __future__ import annotations

import json

import pytest

from holdfast_wire import protocol as p
from holdfast_wire import server as s

TOKEN = "t0ken-0123456789"


def sent(session: s.ServerSession) -> list[dict]:
    return [json.loads(t) for t in session.data_to_send()]


def authed() -> s.ServerSession:
    session = s.ServerSession(token=TOKEN)
    assert session.receive(p.encode(p.Auth(token=TOKEN, client="worker pid=7"))) == [s.Authenticated("worker pid=7")]
    return session


def test_the_right_token_authenticates_and_the_shell_answers_auth_ok():
    session = authed()
    assert session.authenticated and sent(session) == []
    session.send(p.AuthOk(host_id="h1"))
    assert sent(session)[0]["type"] == "auth_ok"
    assert sent(session) == []  # each frame is handed out once


@pytest.mark.parametrize(
    ("first", "code"),
    [
        (p.encode(p.Auth(token="wrong", client="w")), "auth_failed"),
        (p.encode(p.Execute(id="e-1", code="1", timeout_ms=1, memory_mb=1)), "unauthenticated"),
        ("{not json", "unauthenticated"),
    ],
)
def test_anything_but_a_valid_auth_first_is_refused_and_then_ignored(first, code):
    session = s.ServerSession(token=TOKEN)
    assert session.receive(first) == [s.Refused(code)]
    [error] = sent(session)
    assert error["type"] == "error" and error["code"] == code
    assert session.state is s.ServerState.REFUSED
    # Nothing the peer says after a refusal changes it, not even the right token.
    assert session.receive(p.encode(p.Auth(token=TOKEN))) == []
    assert sent(session) == [] and not session.authenticated


def test_the_auth_deadline_refuses_only_before_auth():
    session = s.ServerSession(token=TOKEN)
    assert session.auth_timeout() == [s.Refused("auth_timeout")]
    assert sent(session)[0]["code"] == "auth_timeout"
    assert authed().auth_timeout() == []


def test_pre_auth_bytes_are_counted_to_the_cap_and_reads_cross_it_exactly():
    session = s.ServerSession(token=TOKEN, pre_auth_max_bytes=100)
    assert session.read_size() == 101
    assert session.data_received(60) == []
    assert session.read_size() == 41
    assert session.data_received(40) == []
    assert session.data_received(1) == [s.PreAuthLimit(101)]


def test_pre_auth_bytes_still_count_after_a_refused_auth():
    session = s.ServerSession(token=TOKEN, pre_auth_max_bytes=100)
    session.receive(p.encode(p.Auth(token="wrong")))
    assert session.data_received(101) == [s.PreAuthLimit(101)]


def test_after_auth_bytes_are_not_counted():
    session = authed()
    assert session.data_received(10**9) == []
    assert session.read_size() == s.READ_SIZE


def test_after_auth_requests_become_events():
    session = authed()
    execute = p.Execute(id="e-1", code="1", timeout_ms=1000, memory_mb=64)
    launch = p.LaunchRun(id="r-1", key="k" * 20, control_plane_url="http://cp")
    assert session.receive(p.encode(execute)) == [s.ExecuteRequested(execute)]
    assert session.receive(p.encode(p.Cancel(id="e-1"))) == [s.CancelRequested("e-1")]
    assert session.receive(p.encode(launch)) == [s.RunRequested(launch)]
    assert sent(session) == []


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (p.encode(p.Execute(id="e-1", code="1", timeout_ms=0, memory_mb=64)), "bad_field"),
        (p.encode(p.Auth(token=TOKEN)), "bad_field"),
        (p.encode(p.Result(id="e-1", status="succeeded")), "unknown_type"),
        (json.dumps({"v": 2, "type": "from_the_future"}), "unknown_type"),
        ("[]", "not_an_object"),
    ],
)
def test_bad_input_after_auth_is_answered_and_the_session_stays_open(message, code):
    session = authed()
    assert session.receive(message) == []
    [error] = sent(session)
    assert error["type"] == "error" and error["code"] == code
    assert session.authenticated


def test_admission_answers_and_unknown_ids_go_out_as_frames():
    session = authed()
    session.send(p.NotStarted(id="e-1", reason="at_capacity"))
    session.unknown_id("e-2")
    first, second = sent(session)
    assert first == {"v": 1, "type": "not_started", "id": "e-1", "reason": "at_capacity"}
    assert second["code"] == "unknown_id" and second["id"] == "e-2"


def test_drain_is_told_only_to_an_authenticated_client():
    session = s.ServerSession(token=TOKEN)
    session.drain(5000)
    assert sent(session) == []
    session = authed()
    session.drain(5000)
    assert sent(session) == [{"v": 1, "type": "draining", "grace_ms": 5000}]


def test_a_result_too_large_for_a_client_is_cut_to_fit():
    session = authed()
    session.send(p.Result(id="e-1", status="succeeded", stdout="\x01" * p.MAX_OUTPUT_BYTES))
    [frame] = session.data_to_send()
    assert len(frame.encode()) <= p.MAX_RESULT_FRAME_BYTES
