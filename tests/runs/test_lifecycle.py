"""Compare-and-set claims: launch, hello, and the terminal paths."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db.models import Q

from controlplane.runs import actions, credentials
from controlplane.runs.errors import BadRequest
from controlplane.runs.models import Run, RunStatus

from .conftest import RunnerCalls, launched, new_run

pytestmark = pytest.mark.django_db


def test_launch_claim_moves_queued_to_provisioning_and_stores_only_the_key_hash():
    run = new_run()
    claim = actions.claim_for_launch(run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.PROVISIONING and not claim.relaunch
    assert run.launch_key_hash == credentials.digest(claim.launch_key)
    assert claim.launch_key not in str(Run.objects.filter(pk=run.id).values().get())


def test_redelivered_launch_before_hello_asks_again_with_the_same_key():
    run = new_run()
    first = actions.claim_for_launch(run.id)
    again = actions.claim_for_launch(run.id)
    assert again.relaunch and again.launch_key == first.launch_key


def test_no_launch_once_the_runner_said_hello_or_the_run_ended(client):
    run, key = launched()
    RunnerCalls(client, str(run.id)).post("hello", {"instance_id": "i-1"}, token=key)
    assert actions.claim_for_launch(run.id) is None
    cancelled = new_run()
    assert actions.cancel_run(cancelled.id)
    assert actions.claim_for_launch(cancelled.id) is None
    assert Run.objects.get(pk=cancelled.id).launch_key_hash == ""


def test_hello_is_idempotent_for_the_same_instance(client):
    run, key = launched()
    calls = RunnerCalls(client, str(run.id))
    first = calls.post("hello", {"instance_id": "i-1"}, token=key)
    replay = calls.post("hello", {"instance_id": "i-1"}, token=key)
    assert first.status_code == replay.status_code == 200
    assert first.json()["session_token"] == replay.json()["session_token"]
    run.refresh_from_db()
    assert (run.status, run.instance_id) == (RunStatus.RUNNING, "i-1")


def test_hello_from_another_instance_is_refused(client):
    run, key = launched()
    calls = RunnerCalls(client, str(run.id))
    calls.post("hello", {"instance_id": "i-1"}, token=key)
    other = calls.post("hello", {"instance_id": "i-2"}, token=key)
    assert other.status_code == 409 and other.json()["error"]["code"] == "instance_conflict"
    assert Run.objects.get(pk=run.id).instance_id == "i-1"


def test_hello_needs_the_launch_key(client):
    run, key = launched()
    calls = RunnerCalls(client, str(run.id))
    assert calls.post("hello", {"instance_id": "i-1"}, token="").status_code == 401
    assert calls.post("hello", {"instance_id": "i-1"}, token=key + "x").status_code == 401
    assert Run.objects.get(pk=run.id).status == RunStatus.PROVISIONING


def test_the_session_token_does_not_open_hello_and_the_launch_key_opens_nothing_else(running):
    assert running.post("hello", {"instance_id": "sandbox-1"}).status_code == 401
    assert running.get("bundle", token=running.launch_key).status_code == 401


def test_fail_run_with_a_stale_guard_claims_nothing_and_keeps_the_keys(running):
    run_id = running.run_id
    stamp, older = datetime(2026, 1, 1, tzinfo=UTC), datetime(2025, 12, 31, tzinfo=UTC)
    Run.objects.filter(pk=run_id).update(loss_observed_at=stamp)
    # The tick read an older stamp; the row moved on since, so the claim must not land.
    assert actions.fail_run(run_id, "sandbox_lost", guard=Q(loss_observed_at=older)) is False
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING and run.key_revoked_at is None
    assert running.get("bundle").status_code == 200
    assert actions.fail_run(run_id, "sandbox_lost", guard=Q(loss_observed_at=stamp)) is True
    assert Run.objects.get(pk=run_id).status == RunStatus.FAILED


def test_only_the_first_terminal_claim_wins():
    run = new_run()
    assert actions.cancel_run(run.id) is True
    assert actions.fail_run(run.id, "late") is False
    run.refresh_from_db()
    assert (run.status, run.error) == (RunStatus.CANCELLED, "cancelled by operator")
    assert run.events.filter(type="result").count() == 1


@pytest.mark.parametrize(
    "job",
    [
        {"kind": "ruby", "command": "x"},
        {"kind": "shell"},
        {"kind": "shell", "command": "x", "timeout_s": 0},
        {"kind": "shell", "command": "x", "inputs": {"bad name": "v"}},
    ],
)
def test_create_run_refuses_a_malformed_job(job):
    with pytest.raises(BadRequest):
        actions.create_run("acme", job, {})
    assert Run.objects.count() == 0
