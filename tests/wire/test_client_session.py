"""The client session, fed frames: no sockets (STYLE habit 1)."""

from __future__ import annotations

import json

import pytest

from holdfast_wire import client as c
from holdfast_wire import protocol as p


def text(frame: p.Frame) -> str:
    return p.encode(frame)


def opened(**auth_ok: object) -> c.ClientSession:
    session = c.ClientSession(token="t0ken", client="worker pid=7")
    session.connect()
    events = session.receive(text(p.AuthOk(host_id="h1", isolation="bwrap", **auth_ok)))
    assert isinstance(events[0], c.Authenticated)
    return session


def execute(execution_id: str = "e-1") -> p.Execute:
    return p.Execute(id=execution_id, code="print(1)", timeout_ms=1000, memory_mb=64)


def test_auth_is_the_first_frame_and_nothing_else_may_be_sent_before_auth_ok():
    session = c.ClientSession(token="t0ken", client="worker pid=7")
    with pytest.raises(c.SessionError):
        session.send(execute())
    first = json.loads(session.connect())
    assert first["type"] == "auth" and first["token"] == "t0ken" and first["client"] == "worker pid=7"
    with pytest.raises(c.SessionError):
        session.send(execute())
    with pytest.raises(c.SessionError):
        session.connect()
    [event] = session.receive(text(p.AuthOk(host_id="h1", isolation="bwrap")))
    assert event == c.Authenticated(p.AuthOk(host_id="h1", isolation="bwrap"))
    assert session.state is c.ClientState.OPEN and session.host_id == "h1"
    assert json.loads(session.send(execute()))["type"] == "execute"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (p.Error(code="auth_failed", message="invalid token"), "authentication refused (auth_failed: invalid token)"),
        (p.Draining(grace_ms=5), "authentication refused (draining)"),
        ("not json", "unreadable answer to auth (malformed_json)"),
    ],
)
def test_any_answer_to_auth_but_auth_ok_refuses_the_session(reply, reason):
    session = c.ClientSession(token="t0ken", client="w")
    session.connect()
    [event] = session.receive(reply if isinstance(reply, str) else text(reply))
    assert event == c.AuthRefused(reason)
    assert session.state is c.ClientState.CLOSED
    with pytest.raises(c.SessionError):
        session.send(execute())


def test_a_host_below_the_required_isolation_is_refused_before_anything_is_sent():
    session = c.ClientSession(token="t", client="w", required_isolation="bwrap")
    session.connect()
    [event] = session.receive(text(p.AuthOk(host_id="h9", isolation="insecure-rlimits")))
    assert isinstance(event, c.AuthRefused) and event.isolation and event.host_id == "h9"
    assert "below the required bwrap" in event.reason
    assert session.state is c.ClientState.CLOSED


def test_a_session_that_requires_no_level_accepts_any_host():
    session = c.ClientSession(token="t", client="prober", required_isolation=None)
    session.connect()
    [event] = session.receive(text(p.AuthOk(host_id="h9", isolation="")))
    assert isinstance(event, c.Authenticated)


def test_a_result_resolves_its_pending_request_once():
    session = opened()
    session.send(execute("e-1"))
    session.send(execute("e-2"))
    assert set(session.pending) == {"e-1", "e-2"}
    result = p.Result(id="e-2", status="succeeded", stdout="hi")
    assert session.receive(text(result)) == [c.Answered("e-2", result)]
    assert set(session.pending) == {"e-1"}
    assert session.receive(text(result)) == []  # answered already: not ours any more


def test_an_id_cannot_be_pending_twice():
    session = opened()
    session.send(execute("e-1"))
    with pytest.raises(c.SessionError):
        session.send(execute("e-1"))


def test_an_answer_for_a_request_given_up_is_dropped():
    session = opened()
    session.send(execute("e-1"))
    session.forget("e-1")
    assert session.receive(text(p.Result(id="e-1", status="succeeded"))) == []
    assert session.receive(text(p.Result(id="never-sent", status="succeeded"))) == []


def test_draining_is_heard_once_and_answers_still_resolve():
    session = opened()
    session.send(execute("e-1"))
    assert session.receive(text(p.Draining(grace_ms=30_000))) == [c.HostDraining(30_000, "draining")]
    assert session.draining
    assert session.receive(text(p.Draining(grace_ms=30_000))) == []
    result = p.Result(id="e-1", status="succeeded")
    assert session.receive(text(result)) == [c.Answered("e-1", result)]


def test_auth_ok_that_says_draining_is_heard_as_draining():
    session = c.ClientSession(token="t", client="w")
    session.connect()
    events = session.receive(text(p.AuthOk(host_id="h1", isolation="bwrap", draining=True)))
    assert events[1:] == [c.HostDraining(0, "auth_ok")]
    assert isinstance(events[0], c.Authenticated)


def test_not_started_makes_the_request_movable_and_draining_not_started_retires():
    session = opened()
    session.send(execute("e-1"))
    session.send(execute("e-2"))
    busy = p.NotStarted(id="e-1", reason="at_capacity")
    assert session.receive(text(busy)) == [c.Movable("e-1", busy)]
    assert not session.draining
    leaving = p.NotStarted(id="e-2", reason="draining")
    assert session.receive(text(leaving)) == [c.HostDraining(0, "not_started"), c.Movable("e-2", leaving)]
    assert session.pending == {}


def test_an_error_naming_a_request_answers_it_and_one_naming_none_is_the_hosts():
    session = opened()
    session.send(execute("e-1"))
    named = p.Error(code="duplicate_id", message="m", id="e-1")
    assert session.receive(text(named)) == [c.Answered("e-1", named)]
    anonymous = p.Error(code="unknown_type", message="m")
    assert session.receive(text(anonymous)) == [c.HostError(anonymous)]


def test_run_answers_resolve_by_id_and_probes_by_ref():
    session = opened()
    session.send(p.LaunchRun(id="r-1", key="k" * 20, control_plane_url="http://cp"))
    session.send(p.ProbeRuns(ids=["r-1"], ref="probe-0"))
    session.send(p.StopRun(id="r-2"))
    launched = p.RunLaunched(id="r-1", already=True)
    status = p.RunStatus(statuses={"r-1": {"status": "running"}}, ref="probe-0")
    stopped = p.RunStopped(id="r-2")
    assert session.receive(text(launched)) == [c.Answered("r-1", launched)]
    assert session.receive(text(status)) == [c.Answered("probe-0", status)]
    assert session.receive(text(stopped)) == [c.Answered("r-2", stopped)]


def test_frames_this_release_cannot_read_are_ignored():
    """Compatibility N-1: a newer host may add frame types and fields."""
    session = opened()
    session.send(execute("e-1"))
    newer = json.dumps({"v": 2, "type": "heartbeat", "at": 1})
    assert session.receive(newer) == [c.Ignored("unknown_type")]
    extra = json.dumps({"v": 2, "type": "result", "id": "e-1", "status": "succeeded", "cost": 3})
    [answered] = session.receive(extra)
    assert isinstance(answered, c.Answered) and answered.frame.status == "succeeded"
    assert session.receive(text(p.Started(id="e-1"))) == []


def test_cancel_is_sent_without_becoming_pending():
    session = opened()
    session.send(execute("e-1"))
    assert json.loads(session.send(p.Cancel(id="e-1")))["type"] == "cancel"
    assert set(session.pending) == {"e-1"}
    with pytest.raises(c.SessionError):
        session.send(p.AuthOk(host_id="x"))


def test_a_lost_connection_drops_every_pending_request():
    """It may have run: the shell must never re-send it."""
    session = opened()
    session.send(execute("e-1"))
    session.send(p.StopRun(id="r-1"))
    assert session.connection_lost() == [c.Dropped("e-1"), c.Dropped("r-1")]
    assert session.state is c.ClientState.CLOSED and session.pending == {}
    assert session.receive(text(p.Result(id="e-1", status="succeeded"))) == []
