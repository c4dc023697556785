"""Issue 3, test 5: a terminal run's every endpoint answers 409; its keys no longer
authenticate; secrets and diagnostics stay out of everything written outside events."""

from __future__ import annotations

import logging

import pytest

from controlplane.runs import actions
from controlplane.runs.models import Run, RunStatus

from .conftest import SECRET

pytestmark = pytest.mark.django_db

ENDPOINTS = [
    ("POST", "hello", {"instance_id": "sandbox-1"}),
    ("GET", "bundle", None),
    ("POST", "events", {"batch_key": "late", "events": [{"type": "stdout"}]}),
    ("POST", "result", {"status": "succeeded", "exit_code": 0}),
]


def _call(calls, method, endpoint, body, token=None):
    if body is None and method == "POST":
        return calls.call(method, endpoint, raw=b"bytes", token=token)
    return calls.call(method, endpoint, body, token=token)


def test_result_seals_the_run_and_every_endpoint_then_answers_409(running):
    running.events("b1", "stdout")
    answer = running.post("result", {"status": "succeeded", "exit_code": 0, "summary": {"lines": 1}})
    assert answer.status_code == 200 and len(answer.json()["receipt_sha256"]) == 64
    run = Run.objects.get(pk=running.run_id)
    assert run.status == RunStatus.SUCCEEDED and run.key_revoked_at is not None and run.secrets == {}
    events_before = run.events.count()
    for method, endpoint, body in ENDPOINTS:
        token = running.launch_key if endpoint == "hello" else None
        late = _call(running, method, endpoint, body, token)
        assert late.status_code == 409, endpoint
        assert late.json() == {
            "error": {"code": "run_terminal", "message": late.json()["error"]["message"]},
            "status": "succeeded",
        }
    assert run.events.count() == events_before


def test_a_replayed_result_gets_409_with_the_recorded_status(running):
    running.post("result", {"status": "failed", "exit_code": 3, "error": "boom"})
    replay = running.post("result", {"status": "succeeded", "exit_code": 0})
    assert replay.status_code == 409 and replay.json()["status"] == "failed"
    run = Run.objects.get(pk=running.run_id)
    assert (run.status, run.exit_code) == ("failed", 3)


@pytest.mark.parametrize("end", ["result", "cancel", "fail"])
def test_keys_no_longer_authenticate_after_any_terminal_path(running, end):
    if end == "result":
        running.post("result", {"status": "succeeded", "exit_code": 0})
    elif end == "cancel":
        assert actions.cancel_run(running.run_id)
    else:
        assert actions.fail_run(running.run_id, "sandbox_lost")
    # Even were the row forced back to a live status, the revoked keys stay dead.
    Run.objects.filter(pk=running.run_id).update(status=RunStatus.RUNNING)
    assert running.get("bundle").status_code == 401
    assert running.post("hello", {"instance_id": "sandbox-1"}, token=running.launch_key).status_code == 401


def test_error_text_and_summary_are_redacted_before_they_leave_the_event_stream(running, caplog):
    caplog.set_level(logging.DEBUG)
    running.post(
        "result",
        {
            "status": "failed",
            "exit_code": 1,
            "error": f"auth failed with {SECRET} and Bearer {running.token}",
            "summary": {SECRET: "key", "note": f"password={SECRET}"},
        },
    )
    run = Run.objects.get(pk=running.run_id)
    written = f"{run.error} {run.summary} {caplog.text}"
    assert SECRET not in written and running.token not in written
    assert "auth failed with" in run.error


def test_the_admin_never_shows_secrets_or_key_hashes(admin_client, running):
    run = Run.objects.get(pk=running.run_id)
    page = admin_client.get(f"/admin/runs/run/{run.id}/change/").content.decode()
    listing = admin_client.get("/admin/runs/run/").content.decode()
    assert "echo hi" in page
    for hidden in (SECRET, run.launch_key_hash, run.session_token_hash, run.token_salt):
        assert hidden not in page and hidden not in listing


@pytest.mark.parametrize("token", ["hfs_" + "0" * 64, None], ids=["wrong-key", "launch-key-on-a-session-route"])
def test_a_terminal_run_tells_its_status_only_to_its_own_runner(running, token):
    """Whoever knows a run id but not its key learns nothing from a 409: the key is
    checked before the run's status."""
    running.post("result", {"status": "failed", "exit_code": 3, "error": "boom"})
    for method, endpoint, body in ENDPOINTS:
        key = token if token is not None else ("hfl_" + "1" * 64 if endpoint == "hello" else running.launch_key)
        late = _call(running, method, endpoint, body, key)
        assert late.status_code == 401, endpoint
        assert late.json()["error"]["code"] == "unauthorized"
        assert "status" not in late.json()
        assert "failed" not in late.content.decode()
