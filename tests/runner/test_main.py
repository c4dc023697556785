"""The runner's life against a real HTTP server playing the control plane's contract."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from runner.main import live
from tests.runner.servers import Recorded, Reply, scripted_server

pytestmark = pytest.mark.peer

RUN_KEY = "run-launch-key-0123456789"
SESSION = "session-token-abcdefghij"


class ControlPlane:
    def __init__(self, job: dict[str, Any], result: Reply | None = None) -> None:
        self.job = job
        self.events: list[dict[str, Any]] = []
        self.keys: set[str] = set()
        self.results: list[dict[str, Any]] = []
        self._result = result or Reply(200, {"receipt_sha256": "x"})

    def __call__(self, request: Recorded) -> Reply:
        endpoint = request.path.rsplit("/", 1)[1]
        expected = RUN_KEY if endpoint == "hello" else SESSION
        if request.headers.get("Authorization") != f"Bearer {expected}":
            return Reply(401, {"error": {"code": "unauthenticated", "message": ""}})
        if endpoint == "hello":
            return Reply(200, {"session_token": SESSION, "run_id": 7})
        if endpoint == "bundle":
            return Reply(200, {"job": self.job})
        if endpoint == "events":
            body = request.json()
            if body["batch_key"] not in self.keys:
                self.keys.add(body["batch_key"])
                self.events.extend(body["events"])
            return Reply(200, {"first_seq": 0, "count": len(body["events"])})
        if endpoint == "result":
            self.results.append(request.json())
            return self._result
        return Reply(404, {"error": {"code": "not_found", "message": ""}})


def test_a_shell_job_streams_its_lines_and_reports_its_result() -> None:
    job = {
        "kind": "shell",
        "command": 'echo "one $API_TOKEN"; echo two >&2; env; exit 3',
        "inputs": {},
        "timeout_s": 30,
        "secrets": {"API_TOKEN": "tok-secret-value-1"},
    }
    plane = ControlPlane(job)
    with scripted_server(plane) as server:
        outcome = live(server.url, "7", RUN_KEY)
    assert outcome.status == "failed" and outcome.exit_code == 3
    stdout = [e["data"]["line"] for e in plane.events if e["type"] == "stdout"]
    assert stdout[0] == "one «redacted»"
    assert [e["data"]["line"] for e in plane.events if e["type"] == "stderr"] == ["two"]
    dumped = json.dumps(plane.events)
    assert "tok-secret-value-1" not in dumped
    # The run's own key never reaches the child's environment.
    assert RUN_KEY not in dumped and "HOLDFAST_RUN_KEY" not in dumped
    assert plane.results == [{"status": "failed", "exit_code": 3, "error": "exit code 3", "summary": {}}]


def test_a_python_job_runs_its_source() -> None:
    job = {"kind": "python", "source": "import os, json\nprint(json.loads(os.environ['HOLDFAST_INPUTS'])['n'] * 2)"}
    plane = ControlPlane({**job, "inputs": {"n": 21}, "timeout_s": 30, "secrets": {}})
    with scripted_server(plane) as server:
        assert live(server.url, "7", RUN_KEY).status == "succeeded"
    assert [e["data"]["line"] for e in plane.events] == ["42"]


def test_a_terminal_run_with_another_verdict_counts_as_recorded_and_leaves_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    terminal = Reply(409, {"error": {"code": "run_terminal", "message": ""}, "status": "cancelled"})
    plane = ControlPlane({"kind": "shell", "command": "true", "timeout_s": 30, "secrets": {}}, result=terminal)
    with scripted_server(plane) as server:
        assert live(server.url, "7", RUN_KEY).status == "succeeded"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert " event=result_discarded_run_terminal " in err[0] and " level=warning " in err[0]
    assert "recorded_status=cancelled" in err[0] and "attempted_status=succeeded" in err[0]
    assert SESSION not in err[0] and RUN_KEY not in err[0]


def test_a_job_past_its_timeout_is_killed_and_fails() -> None:
    plane = ControlPlane({"kind": "shell", "command": "echo start; sleep 30", "timeout_s": 0.5, "secrets": {}})
    with scripted_server(plane) as server:
        outcome = live(server.url, "7", RUN_KEY)
    assert (outcome.status, outcome.error) == ("failed", "job timed out")
    assert [e["data"]["line"] for e in plane.events] == ["start"]


def _python_m_runner(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    root = pathlib.Path(__file__).resolve().parents[2]
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "runner", *args], env={**base, **env}, capture_output=True, text=True, timeout=60
    )


def test_python_m_runner_reads_its_inputs_from_the_environment_and_keeps_them_from_the_job() -> None:
    job = {"kind": "shell", "command": "env", "timeout_s": 30, "secrets": {}}
    plane = ControlPlane(job)
    with scripted_server(plane) as server:
        done = _python_m_runner(
            {"HOLDFAST_RUN_ID": "7", "HOLDFAST_RUN_KEY": RUN_KEY, "HOLDFAST_CONTROL_PLANE_URL": server.url}
        )
    assert done.returncode == 0, done.stderr
    lines = [e["data"]["line"] for e in plane.events]
    assert any(line.startswith("PATH=") for line in lines), lines
    allowed = ("HOLDFAST_INPUTS=", "HOLDFAST_STEER=stdin")
    assert not [line for line in lines if line.startswith("HOLDFAST_") and not line.startswith(allowed)]
    assert "HOLDFAST_STEER=stdin" in lines
    assert RUN_KEY not in json.dumps(plane.events) and RUN_KEY not in done.stderr
    assert plane.results[0]["status"] == "succeeded"


@pytest.mark.parametrize("args", [("--key", RUN_KEY), ()])
def test_python_m_runner_refuses_arguments_and_missing_inputs(args: tuple[str, ...]) -> None:
    done = _python_m_runner({"HOLDFAST_RUN_ID": "7"}, *args)
    assert done.returncode == 2
    assert RUN_KEY not in done.stderr


def _undeliverable_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " logger=holdfast.runner event=undeliverable " in line]


def test_a_hello_that_never_succeeds_leaves_one_breadcrumb_and_exits_1_without_a_traceback() -> None:
    plane = ControlPlane({"kind": "shell", "command": "true", "timeout_s": 30, "secrets": {}})
    with scripted_server(plane) as server:
        done = _python_m_runner(
            {"HOLDFAST_RUN_ID": "7", "HOLDFAST_RUN_KEY": "wrong-" + RUN_KEY, "HOLDFAST_CONTROL_PLANE_URL": server.url}
        )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = _undeliverable_lines(done.stderr)
    assert line.startswith("ts=") and " level=error " in line
    assert "run_id=7" in line and "endpoint=hello" in line and "attempts=1" in line
    assert RUN_KEY not in done.stderr


def test_a_result_that_cannot_be_delivered_leaves_one_breadcrumb_with_its_attempted_status() -> None:
    job = {"kind": "shell", "command": "echo done", "timeout_s": 30, "secrets": {"API_TOKEN": "tok-secret-value-9"}}
    plane = ControlPlane(job, result=Reply(400, {"error": {"code": "bad_request", "message": "tok-secret-value-9"}}))
    with scripted_server(plane) as server:
        done = _python_m_runner(
            {"HOLDFAST_RUN_ID": "7", "HOLDFAST_RUN_KEY": RUN_KEY, "HOLDFAST_CONTROL_PLANE_URL": server.url}
        )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = _undeliverable_lines(done.stderr)
    assert "endpoint=result" in line and "attempted_status=succeeded" in line and "reason=ServerRejected" in line
    assert RUN_KEY not in done.stderr and SESSION not in done.stderr and "tok-secret-value-9" not in done.stderr


def test_an_outage_past_the_budget_names_its_attempt_count() -> None:
    from runner.main import Undeliverable, breadcrumb
    from runner.transport import OutageExceeded

    failure = Undeliverable.from_transport(OutageExceeded("result", 23, "connect: ConnectionRefusedError"), "failed")
    assert breadcrumb("run-1", failure) == {
        "attempted_status": "failed",
        "attempts": 23,
        "endpoint": "result",
        "reason": "OutageExceeded",
        "run_id": "run-1",
    }


def test_once_the_bundle_is_read_every_log_line_is_redacted_with_the_job_s_secrets_and_session(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from runner.log import Redactor, fields, log, use_redactor

    secret = "tok-secret-value-5"
    plane = ControlPlane({"kind": "shell", "command": "true", "timeout_s": 30, "secrets": {"API_TOKEN": secret}})
    try:
        with scripted_server(plane) as server:
            assert live(server.url, "7", RUN_KEY).status == "succeeded"
        capsys.readouterr()
        log.warning("probe", extra=fields(error=f"{secret} {SESSION} {RUN_KEY}"))
        line = capsys.readouterr().err
    finally:
        use_redactor(Redactor(()))
    assert " event=probe " in line and secret not in line and SESSION not in line and RUN_KEY not in line
