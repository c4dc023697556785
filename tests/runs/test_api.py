"""The runner's endpoints: replay safety, bounds, and malformed input changing nothing."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from controlplane.runs.models import PushToken, Run, RunArtifact, RunEvent, RunEventBatch

from .conftest import SECRET, RunnerCalls

pytestmark = pytest.mark.django_db


def test_bundle_carries_the_job_and_its_secrets(running):
    job = running.get("bundle").json()["job"]
    assert job["command"] == "echo hi" and job["secrets"] == {"API_TOKEN": SECRET}


def test_events_get_gapless_sequence_numbers_across_batches(running):
    assert running.events("b1", "stdout", "stderr").json() == {"first_seq": 1, "count": 2}
    assert running.events("b2", "stdout").json() == {"first_seq": 3, "count": 1}
    assert list(RunEvent.objects.filter(run_id=running.run_id).values_list("seq", flat=True)) == [1, 2, 3]


def test_a_replayed_batch_returns_the_original_answer_and_adds_no_rows(running):
    first = running.events("b1", "stdout", "stdout").json()
    running.events("b2", "stderr")
    replay = running.events("b1", "stdout", "stdout")
    assert replay.status_code == 200 and replay.json() == first == {"first_seq": 1, "count": 2}
    assert RunEvent.objects.filter(run_id=running.run_id).count() == 3
    assert RunEventBatch.objects.filter(run_id=running.run_id).count() == 2


def test_a_replayed_batch_without_timestamps_is_still_recognised(running):
    body = {"batch_key": "b1", "events": [{"type": "stdout", "data": {"line": "x"}}]}
    first = running.post("events", body).json()
    replay = running.post("events", body)
    assert replay.status_code == 200 and replay.json() == first
    assert RunEvent.objects.filter(run_id=running.run_id).count() == 1


def test_a_batch_key_reused_for_other_events_is_refused(running):
    running.events("b1", "stdout")
    answer = running.events("b1", "stderr")
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "batch_key_conflict"
    assert RunEvent.objects.filter(run_id=running.run_id).count() == 1


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"{not json", 400),
        (b"[]", 400),
        (b'{"batch_key": "k", "events": []}', 400),
        (b'{"batch_key": "", "events": [{"type": "x"}]}', 400),
        (b'{"batch_key": "k", "events": [{"type": "x", "data": 1}]}', 400),
        (b'{"batch_key": "k", "events": [{"type": "x", "ts": "yesterday"}]}', 400),
        (b'{"batch_key": "k", "events": [{"type": "x", "data": {"v": NaN}}]}', 400),
        (b'{"batch_key": "k", "events": [{"type": "x", "data": {"v": "a\\u0000b"}}]}', 400),
        (b'{"batch_key": "k", "events": [{"type": "x", "data": {"v": "\\ud800"}}]}', 400),
        (b'{"batch_key": "k", "events": [{"type": "ok"}, {"type": 5}]}', 400),
        (b"\xff\xfe", 400),
    ],
)
def test_malformed_events_change_nothing(running, raw, status):
    answer = running.post("events", raw=raw)
    assert answer.status_code == status and answer.json()["error"]["code"] == "bad_request"
    assert RunEvent.objects.filter(run_id=running.run_id).count() == 0
    assert RunEventBatch.objects.filter(run_id=running.run_id).count() == 0


@override_settings(RUNS_MAX_EVENTS_PER_BATCH=3, RUNS_MAX_EVENTS_BODY_BYTES=2048)
def test_oversize_batches_are_refused_whole(running):
    assert running.events("b1", *["stdout"] * 4).status_code == 413
    big = {"batch_key": "b2", "events": [{"type": "stdout", "data": {"line": "x" * 4096}}]}
    answer = running.post("events", big)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "too_large"
    assert RunEvent.objects.filter(run_id=running.run_id).count() == 0


def test_push_token_is_minted_once_per_request_key(running):
    first = running.post("push-token", {"request_key": "push-1", "scope": "contents:write"}).json()
    replay = running.post("push-token", {"request_key": "push-1", "scope": "contents:write"}).json()
    other = running.post("push-token", {"request_key": "push-2", "scope": "contents:write"}).json()
    assert first == replay and other["token"] != first["token"]
    assert PushToken.objects.filter(run_id=running.run_id).count() == 2
    assert first["token"] not in json.dumps(list(PushToken.objects.values()), default=str)


def test_push_token_request_key_reused_for_another_scope_is_refused(running):
    running.post("push-token", {"request_key": "push-1", "scope": "contents:write"})
    answer = running.post("push-token", {"request_key": "push-1", "scope": "admin"})
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "request_key_conflict"
    assert PushToken.objects.filter(run_id=running.run_id).count() == 1


@override_settings(RUNS_MAX_PUSH_TOKENS_PER_RUN=2)
def test_push_tokens_per_run_are_bounded(running):
    for key in ("a", "b"):
        assert running.post("push-token", {"request_key": key, "scope": "s"}).status_code == 200
    assert running.post("push-token", {"request_key": "c", "scope": "s"}).status_code == 409
    assert PushToken.objects.filter(run_id=running.run_id).count() == 2


def test_session_state_round_trips_and_last_writer_wins(running):
    answer = running.get("session-state")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "no_session_state"
    running.post("session-state", raw=b"first")
    uri = running.post("session-state", raw=b"\x00second").json()["uri"]
    assert uri.endswith("/session-state")
    assert running.get("session-state").content == b"\x00second"
    assert RunArtifact.objects.filter(run_id=running.run_id).count() == 1


@override_settings(RUNS_MAX_TRANSCRIPT_BYTES=1024)
def test_transcript_is_stored_once_per_run_and_bounded(running):
    running.post("transcript", raw=b'{"a": 1}\n')
    running.post("transcript", raw=b'{"a": 2}\n')
    assert running.post("transcript", raw=b"x" * 2048).status_code == 413
    row = RunArtifact.objects.get(run_id=running.run_id, kind="transcript")
    assert bytes(row.data) == b'{"a": 2}\n'


def test_forged_run_ids_are_not_found(client, running):
    for run_id in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        answer = RunnerCalls(client, run_id, running.token).get("bundle")
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"


def test_a_session_token_opens_only_its_own_run(client, running):
    from .conftest import launched

    other, key = launched()
    other_calls = RunnerCalls(client, str(other.id))
    other_calls.token = other_calls.post("hello", {"instance_id": "i-9"}, token=key).json()["session_token"]
    assert RunnerCalls(client, running.run_id, other_calls.token).get("bundle").status_code == 401


def test_wrong_method_is_refused(running):
    answer = running.get("events")
    assert answer.status_code == 405 and answer["Allow"] == "POST"


@pytest.mark.parametrize(
    "body",
    [
        {"status": "exploded"},
        {"status": "succeeded", "exit_code": "0"},
        {"status": "succeeded", "exit_code": True},
        {"status": "failed", "error": 7},
        {"status": "succeeded", "summary": []},
    ],
)
def test_malformed_result_changes_nothing(running, body):
    assert running.post("result", body).status_code == 400
    run = Run.objects.get(pk=running.run_id)
    assert run.status == "running" and run.key_revoked_at is None and not hasattr(run, "receipt")
