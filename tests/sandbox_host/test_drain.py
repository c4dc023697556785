"""SIGTERM drain (DESIGN.md, Host): stop accepting, tell clients, refuse new work with
``not_started`` before any process exists, finish in-flight work within the grace
period, close with 1001, exit 0."""

from __future__ import annotations

import socket

import pytest
import websocket

from holdfast_wire import protocol
from tests.support.host import connect, execute, new_id, recv_frame, send_frame, start_host
from tests.timing import scaled, wait_until

from .conftest import TOKEN
from .test_bad_input import close_code

pytestmark = pytest.mark.peer


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_finishes_in_flight_work_refuses_new_work_and_exits_0():
    with start_host(TOKEN, extra_args=("--drain-grace-s", "30")) as host:
        ws = connect(host.url, TOKEN, timeout=scaled(30))
        try:
            in_flight = new_id()
            code = "import time\ntime.sleep(2)\nprint('finished')"
            send_frame(ws, protocol.Execute(id=in_flight, code=code, timeout_ms=20_000, memory_mb=128))
            assert recv_frame(ws) == protocol.Started(id=in_flight)

            host.terminate()
            assert recv_frame(ws) == protocol.Draining(grace_ms=30_000)
            wait_until(lambda: _refuses_connections(host.port), timeout=5, what="the listener to close")

            late = new_id()
            send_frame(ws, protocol.Execute(id=late, code="print('never')", timeout_ms=5000, memory_mb=128))
            assert recv_frame(ws) == protocol.NotStarted(id=late, reason="draining")

            result = recv_frame(ws)
            assert isinstance(result, protocol.Result)
            assert (result.id, result.status, result.stdout) == (in_flight, "succeeded", "finished\n"), result
            assert close_code(ws) == 1001
        finally:
            ws.close()
        assert host.wait(scaled(20)) == 0
        assert f"id={late}" in host.log() and "execution_started conn=c1 id=" + late not in host.log()


def test_work_still_running_when_the_grace_ends_is_killed_and_reported():
    with start_host(TOKEN, extra_args=("--drain-grace-s", "1")) as host:
        ws = connect(host.url, TOKEN, timeout=scaled(30))
        try:
            stuck = new_id()
            send_frame(
                ws, protocol.Execute(id=stuck, code="import time\ntime.sleep(60)", timeout_ms=60_000, memory_mb=128)
            )
            assert recv_frame(ws) == protocol.Started(id=stuck)
            host.terminate()
            assert recv_frame(ws) == protocol.Draining(grace_ms=1000)
            result = recv_frame(ws)
            assert isinstance(result, protocol.Result) and (result.id, result.status) == (stuck, "failed")
            assert "drain grace" in result.error
            assert close_code(ws) == 1001
        finally:
            ws.close()
        assert host.wait(scaled(20)) == 0


def test_an_idle_host_exits_0_on_sigterm_and_closes_clients_with_1001():
    with start_host(TOKEN) as host:
        ws = connect(host.url, TOKEN)
        try:
            assert execute(ws, "print(1)").stdout == "1\n"
            host.terminate()
            assert recv_frame(ws) == protocol.Draining(grace_ms=60_000)
            assert close_code(ws) == 1001
        finally:
            ws.close()
        assert host.wait(scaled(20)) == 0


def test_a_client_that_authenticates_during_the_drain_is_told_at_once():
    with start_host(TOKEN, extra_args=("--drain-grace-s", "30")) as host:
        early = connect(host.url, TOKEN, timeout=scaled(30))
        raw = websocket.create_connection(host.url, timeout=scaled(30))  # connected, not yet authenticated
        try:
            running = new_id()
            send_frame(
                early, protocol.Execute(id=running, code="import time\ntime.sleep(2)", timeout_ms=20_000, memory_mb=128)
            )
            assert recv_frame(early) == protocol.Started(id=running)
            host.terminate()
            assert recv_frame(early) == protocol.Draining(grace_ms=30_000)
            send_frame(raw, protocol.Auth(token=TOKEN))
            answer = recv_frame(raw)
            assert isinstance(answer, protocol.AuthOk) and answer.draining is True
        finally:
            early.close()
            raw.close()
        assert host.wait(scaled(20)) == 0


def test_an_empty_token_refuses_to_start_with_exit_2():
    import subprocess
    import sys

    from tests.support.host import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "sandbox_host", "--listen", "127.0.0.1:0"],
        cwd=ROOT,
        env={"HOLDFAST_SANDBOX_TOKEN": "", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )
    assert done.returncode == 2
    assert "HOLDFAST_SANDBOX_TOKEN is empty" in done.stderr
    assert done.stdout == ""
