"""The WebSocket launch driver against real sandbox hosts: launch, idempotency by run id,
a draining or unreachable host skipped for the next address, the default selection."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator

import pytest
from django.test import override_settings

from controlplane.runs import launcher
from controlplane.runs.host_driver import WebSocketLaunchDriver
from controlplane.runs.launcher import LaunchRequest, LaunchUnavailable
from holdfast_wire import protocol
from tests.integration.support import free_port, stop_runs
from tests.support.host import connect, new_id, recv_frame, send_frame, start_host
from tests.support.scripted import scripted_host
from tests.timing import scaled

pytestmark = pytest.mark.peer

TOKEN = "hf-driver-test-" + uuid.uuid4().hex
# Nothing listens here: a launched runner retries in the background until stop_runs.
CONTROL_PLANE = "http://127.0.0.1:9"


def _driver(*urls: str) -> WebSocketLaunchDriver:
    return WebSocketLaunchDriver(urls=urls, token=TOKEN, connect_timeout_s=scaled(5), reply_timeout_s=scaled(10))


def _request() -> LaunchRequest:
    return LaunchRequest(str(uuid.uuid4()), "hfl_" + uuid.uuid4().hex, CONTROL_PLANE)


@pytest.fixture
def state_dir(tmp_path):
    yield tmp_path
    stop_runs(tmp_path)


def test_a_launch_lands_once_and_a_relaunch_is_answered_already(state_dir):
    with start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
        request = _request()
        first = _driver(host.url).launch(request)
        again = _driver(host.url).launch(request)
    assert (first.host_id, first.already_launched) == (host.host_id, False)
    assert (again.host_id, again.already_launched) == (host.host_id, True)
    assert host.log().count("event=run_launched ") == 1
    assert request.launch_key not in host.log() and request.launch_key not in repr(request)


def test_an_unreachable_address_is_skipped_for_the_next(state_dir):
    dead = f"ws://127.0.0.1:{free_port()}"
    with start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
        for _ in range(3):  # the first address is random: each order must land
            assert _driver(dead, host.url).launch(_request()).host_id == host.host_id
    with pytest.raises(LaunchUnavailable):
        _driver(dead).launch(_request())


def test_a_host_below_the_required_isolation_launches_nothing(state_dir):
    """A run's sandbox holds its key and its job: a host started without the full
    containment is passed over, and with no other host the launch is unavailable."""
    args = ("--state-dir", str(state_dir), "--isolation", "insecure-rlimits")
    with (
        start_host(TOKEN, extra_args=args) as weak,
        start_host(TOKEN, extra_args=("--state-dir", str(state_dir / "s2"))) as full,
    ):
        for _ in range(3):  # the first address is random: each order must land on the full host
            assert _driver(weak.url, full.url).launch(_request()).host_id == full.host_id
        with pytest.raises(LaunchUnavailable, match="below the required bwrap"):
            _driver(weak.url).launch(_request())
    assert "event=run_launched " not in weak.log()
    stop_runs(state_dir / "s2")


def test_a_draining_host_starts_nothing_and_the_launch_is_unavailable(state_dir):
    with start_host(TOKEN, extra_args=("--state-dir", str(state_dir), "--drain-grace-s", "30")) as host:
        ws = connect(host.url, TOKEN, timeout=scaled(30))
        busy = new_id()
        send_frame(ws, protocol.Execute(id=busy, code="import time\ntime.sleep(3)", timeout_ms=20_000, memory_mb=128))
        assert recv_frame(ws) == protocol.Started(id=busy)
        host.terminate()
        assert isinstance(recv_frame(ws), protocol.Draining)
        # The listener is closed while draining: the driver cannot even connect.
        with pytest.raises(LaunchUnavailable):
            _driver(host.url).launch(_request())
        ws.close()
    assert "event=run_launched " not in host.log()


@contextlib.contextmanager
def old_host() -> Iterator[str]:
    """A FAKE host of a release without runs, named as such: it authenticates anyone and
    answers every frame type it does not know (launch_run) with unknown_type, as the
    real host of that release does. It reports the full isolation, so what is tested here
    is the unknown_type path (a host reporting no level is refused before that: see
    test_a_host_below_the_required_isolation_launches_nothing)."""

    def handler(ws) -> None:
        ws.recv()
        ws.send(protocol.encode(protocol.AuthOk(host_id="old-host", isolation=protocol.FULL_ISOLATION)))
        for message in ws:
            kind = json.loads(message)["type"]
            ws.send(protocol.encode(protocol.Error(code="unknown_type", message=f"unknown frame type {kind!r}")))

    with scripted_host(handler) as url:
        yield url


def test_a_host_of_a_release_without_runs_is_skipped_for_the_next(state_dir):
    with old_host() as old, start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
        with pytest.raises(LaunchUnavailable, match="does not launch runs"):
            _driver(old).launch(_request())
        assert _driver(old, host.url).launch(_request()).host_id == host.host_id


@override_settings(RUNS_LAUNCH_DRIVER="", SANDBOX_URL="ws://127.0.0.1:1", SANDBOX_TOKEN="t")
def test_the_websocket_driver_is_the_default_when_the_sandbox_pool_is_configured():
    launcher.set_driver(None)
    assert isinstance(launcher.get_driver(), WebSocketLaunchDriver)


@override_settings(RUNS_LAUNCH_DRIVER="", SANDBOX_URL="", SANDBOX_TOKEN="")
def test_without_a_sandbox_pool_launching_is_not_configured():
    launcher.set_driver(None)
    with pytest.raises(launcher.LaunchNotConfigured):
        launcher.get_driver()


def _probe(url: str, run_id: str) -> str:
    ws = connect(url, TOKEN, timeout=scaled(10))
    try:
        send_frame(ws, protocol.ProbeRuns(ids=[run_id]))
        while True:
            frame = recv_frame(ws)
            if isinstance(frame, protocol.RunStatus):
                return frame.statuses[run_id]["status"]
    finally:
        ws.close()


def test_stop_kills_the_sandbox_on_the_host_that_launched_it(state_dir):
    with (
        start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host,
        start_host(TOKEN, extra_args=("--state-dir", str(state_dir / "other"))) as other,
    ):
        request = _request()
        ack = _driver(host.url).launch(request)
        assert _probe(host.url, request.run_id) == "running"
        # The other host is dialled first and left alone: only the launching host knows the run.
        assert _driver(other.url, host.url).stop(request.run_id, ack.host_id) is True
        assert _probe(host.url, request.run_id) == "exited"
        assert _driver(other.url).stop(request.run_id, ack.host_id) is False
