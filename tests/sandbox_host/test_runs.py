"""Run sandboxes on a real host: launch is idempotent by run id, the sandbox is detached
(a host restart with the same state dir still knows it), stop and probe, a draining
host refuses new launches, and the run's key goes nowhere but the runner.

The control plane here is a scripted HTTP server (tests/runner/servers.py) playing the
runner API, so these tests need no database."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from holdfast_wire import protocol
from tests.integration.support import stop_runs
from tests.runner.servers import Recorded, Reply, scripted_server
from tests.support.host import connect, recv_frame, send_frame, start_host
from tests.timing import scaled, wait_until

from .conftest import TOKEN

pytestmark = pytest.mark.peer

KEY = "hfl_run-key-" + uuid.uuid4().hex


class ControlPlane:
    """Plays hello/bundle/events/result for one job; counts hellos per instance."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.lines: list[str] = []
        self.hellos: list[str] = []
        self.results: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, request: Recorded) -> Reply:
        endpoint = request.path.rsplit("/", 1)[1]
        with self.lock:
            if endpoint == "hello":
                self.hellos.append(request.json()["instance_id"])
                if len(set(self.hellos)) > 1:
                    return Reply(409, {"error": {"code": "instance_conflict", "message": "another instance"}})
                return Reply(200, {"session_token": "hfs_session", "run_id": "r"})
            if endpoint == "bundle":
                job = {"kind": "shell", "command": self.command, "inputs": {}, "timeout_s": 60, "secrets": {}}
                return Reply(200, {"job": job})
            if endpoint == "events":
                self.lines += [e["data"]["line"] for e in request.json()["events"]]
                return Reply(200, {"first_seq": 1, "count": 1})
            if endpoint == "result":
                self.results.append(request.json())
                return Reply(200, {"receipt_sha256": "x"})
        return Reply(404, {"error": {"code": "not_found", "message": ""}})


@pytest.fixture
def state_dir(tmp_path):
    yield tmp_path
    stop_runs(tmp_path)


def _launch(ws, run_id: str, url: str) -> protocol.Frame:
    send_frame(ws, protocol.LaunchRun(id=run_id, key=KEY, control_plane_url=url))
    return recv_frame(ws)


def _probe(ws, *ids: str) -> dict:
    send_frame(ws, protocol.ProbeRuns(ids=list(ids), ref="p1"))
    answer = recv_frame(ws)
    assert isinstance(answer, protocol.RunStatus) and answer.ref == "p1", answer
    return answer.statuses


def test_a_run_runs_its_job_once_however_often_it_is_launched(state_dir):
    plane = ControlPlane("echo one; echo two")
    with scripted_server(plane) as cp, start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
        ws = connect(host.url, TOKEN)
        run_id = str(uuid.uuid4())
        assert _launch(ws, run_id, cp.url) == protocol.RunLaunched(id=run_id, already=False)
        assert _launch(ws, run_id, cp.url) == protocol.RunLaunched(id=run_id, already=True)
        wait_until(lambda: _probe(ws, run_id)[run_id]["status"] == "exited", timeout=30, what="the run to exit")
        # Launched again after it exited: still nothing new.
        assert _launch(ws, run_id, cp.url) == protocol.RunLaunched(id=run_id, already=True)
        assert _probe(ws, run_id, "never-launched") == {
            run_id: {"status": "exited", "exit_code": 0},
            "never-launched": {"status": "unknown", "exit_code": None},
        }
        ws.close()
    assert plane.lines == ["one", "two"]
    assert len(plane.hellos) == 1 and len(plane.results) == 1 and plane.results[0]["status"] == "succeeded"
    assert host.log().count("event=run_launched ") == 1


def test_the_key_reaches_the_runner_only(state_dir):
    # The job looks for the key everywhere it could: its environment, its parent's
    # environment through /proc (the runner is non-dumpable), every process's argv.
    command = (
        "env; cat /proc/$PPID/environ 2>&1 | tr '\\0' '\\n'; "
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"
    )
    plane = ControlPlane(command)
    with scripted_server(plane) as cp, start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
        ws = connect(host.url, TOKEN)
        run_id = str(uuid.uuid4())
        assert _launch(ws, run_id, cp.url) == protocol.RunLaunched(id=run_id, already=False)
        wait_until(lambda: plane.results, timeout=30, what="the run's result")
        ws.close()
    output = "\n".join(plane.lines)
    assert "PATH=" in output and "Permission denied" in output, output  # it did look
    assert KEY not in output and "HOLDFAST_RUN_KEY" not in output and TOKEN not in output
    assert KEY not in host.log() and KEY not in (state_dir / "runs" / f"{run_id}.log").read_text()


def test_a_run_outlives_its_host_and_a_restarted_host_still_knows_it(state_dir):
    plane = ControlPlane("echo started; sleep 60")
    run_id = str(uuid.uuid4())
    with scripted_server(plane) as cp:
        with start_host(TOKEN, host_id="h-restart", extra_args=("--state-dir", str(state_dir))) as first:
            ws = connect(first.url, TOKEN)
            assert _launch(ws, run_id, cp.url) == protocol.RunLaunched(id=run_id, already=False)
            wait_until(lambda: plane.lines == ["started"], timeout=30, what="the job to start")
            ws.close()
        assert first.popen.returncode == 0  # SIGTERM drained and exited without waiting on the run
        with start_host(TOKEN, host_id="h-restart", extra_args=("--state-dir", str(state_dir))) as second:
            ws = connect(second.url, TOKEN)
            assert _probe(ws, run_id)[run_id] == {"status": "running", "exit_code": None}
            assert _launch(ws, run_id, cp.url) == protocol.RunLaunched(id=run_id, already=True)
            send_frame(ws, protocol.StopRun(id=run_id))
            assert recv_frame(ws) == protocol.RunStopped(id=run_id, was_running=True)
            wait_until(lambda: _probe(ws, run_id)[run_id]["status"] == "exited", timeout=10, what="the stop")
            send_frame(ws, protocol.StopRun(id=run_id))
            assert recv_frame(ws) == protocol.RunStopped(id=run_id, was_running=False)
            ws.close()
    assert len(plane.hellos) == 1


def test_a_draining_host_refuses_a_new_launch_before_starting_anything(state_dir):
    with start_host(TOKEN, extra_args=("--state-dir", str(state_dir), "--drain-grace-s", "30")) as host:
        ws = connect(host.url, TOKEN, timeout=scaled(30))
        # An execution in flight keeps the drain open long enough to ask.
        busy = uuid.uuid4().hex
        code = "import time\ntime.sleep(3)"
        send_frame(ws, protocol.Execute(id=busy, code=code, timeout_ms=20_000, memory_mb=128))
        assert recv_frame(ws) == protocol.Started(id=busy)
        host.terminate()
        assert isinstance(recv_frame(ws), protocol.Draining)
        run_id = str(uuid.uuid4())
        assert _launch(ws, run_id, "http://127.0.0.1:9") == protocol.NotStarted(id=run_id, reason="draining")
        ws.close()
    assert not (Path(state_dir) / "runs" / f"{run_id}.json").exists()
    assert "event=run_launched " not in host.log()


def test_bad_run_frames_are_answered_not_punished(state_dir):
    with start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
        ws = connect(host.url, TOKEN)
        ws.send('{"type": "launch_run", "id": "r1", "key": "has space", "control_plane_url": "http://x"}')
        answer = recv_frame(ws)
        assert (answer.code, answer.id) == ("bad_field", "r1") and "space" not in answer.message
        ws.send('{"type": "launch_run", "id": "r1", "key": "k", "control_plane_url": "file:///etc/passwd"}')
        assert recv_frame(ws).code == "bad_field"
        ws.send('{"type": "probe_runs", "ids": ["ok", "../etc"]}')
        assert recv_frame(ws).code == "bad_field"
        assert _probe(ws, "r1") == {"r1": {"status": "unknown", "exit_code": None}}
        ws.close()
    assert not os.listdir(state_dir / "runs")


def test_the_runners_interpreter_never_imports_from_its_working_directory(tmp_path):
    """The job writes /tmp, the runner's working directory: a module planted there must
    never be what the key-holding runner imports."""
    from sandbox_host.runs import RUNNER_FLAGS
    from sandbox_host.sandbox import base_interpreter

    (tmp_path / "planted.py").write_text("print('PLANTED')")
    done = subprocess.run(
        [base_interpreter()[0], *RUNNER_FLAGS, "-c", "import planted"], cwd=tmp_path, capture_output=True, text=True
    )
    assert "PLANTED" not in done.stdout and "ModuleNotFoundError" in done.stderr
