"""The runner's endpoints: replay safety, bounds, and malformed input changing nothing."""

from __future__ import annotations

import pytest
from django.test import override_settings

from controlplane.runs.models import Run, RunEvent, RunEventBatch

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
