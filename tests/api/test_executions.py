"""POST/GET /executions and cancel, on the rows (no worker: an execution stays queued,
which is all these routes need). Executions that really run: test_executions_run.py."""

from __future__ import annotations

import json
import uuid

import pytest

from controlplane.executions.models import Execution, Status
from controlplane.owners import errors as owner_errors

from .conftest import error

pytestmark = pytest.mark.django_db


def test_a_submitted_execution_is_queued_for_its_key_s_owner(api):
    answer = api.post("/executions", {"code": "print(1)", "timeout_s": 5, "memory_mb": 64})
    assert answer.status_code == 202
    body = json.loads(answer.body)
    row = Execution.objects.get(pk=body["id"])
    assert (row.owner, row.code, row.timeout_ms, row.memory_mb) == ("acme", "print(1)", 5000, 64)
    assert body["status"] == "queued" and body["timeout_s"] == 5 and body["memory_mb"] == 64
    assert answer["Location"] == f"/api/v1/executions/{row.pk}"


def test_defaults_apply_when_limits_are_not_given(api, settings):
    body = json.loads(api.post("/executions", {"code": "print(1)"}).body)
    assert body["timeout_s"] == settings.EXECUTION_DEFAULT_TIMEOUT_S
    assert body["memory_mb"] == settings.EXECUTION_DEFAULT_MEMORY_MB


def test_an_owner_reads_its_execution(api):
    created = json.loads(api.post("/executions", {"code": "print(1)"}).body)
    Execution.objects.filter(pk=created["id"]).update(status=Status.SUCCEEDED, stdout="1\n", exit_code=0)
    answer = api.get(f"/executions/{created['id']}")
    assert answer.status_code == 200
    body = json.loads(answer.body)
    assert (body["id"], body["status"], body["stdout"], body["exit_code"]) == (created["id"], "succeeded", "1\n", 0)
    assert "code" not in body


@pytest.mark.parametrize("suffix", ["", "/cancel"])
def test_another_owner_s_execution_is_not_found_and_left_alone(api, other, suffix):
    mine = json.loads(api.post("/executions", {"code": "print(1)"}).body)["id"]
    method = "GET" if suffix == "" else "POST"
    answer = other.call(method, f"/executions/{mine}{suffix}")
    assert answer.status_code == 404 and error(answer)["code"] == "not_found"
    # Exactly what an id that does not exist gets: nothing tells the two apart.
    missing = other.call(method, f"/executions/{uuid.uuid4()}{suffix}")
    assert json.loads(missing.body) == json.loads(answer.body)
    assert Execution.objects.get(pk=mine).status == Status.QUEUED


@pytest.mark.parametrize("bad_id", ["not-a-uuid", "1", "00000000-0000-0000-0000-00000000000g"])
def test_a_malformed_id_is_not_found(api, bad_id):
    assert api.get(f"/executions/{bad_id}").status_code == 404
    assert api.post(f"/executions/{bad_id}/cancel").status_code == 404


def test_cancel_cancels_a_queued_execution_and_is_safe_to_repeat(api):
    created = json.loads(api.post("/executions", {"code": "print(1)"}).body)["id"]
    first = api.post(f"/executions/{created}/cancel")
    assert first.status_code == 200 and json.loads(first.body)["status"] == "cancelled"
    again = api.post(f"/executions/{created}/cancel")
    assert again.status_code == 200 and json.loads(again.body)["status"] == "cancelled"
    assert Execution.objects.get(pk=created).status == Status.CANCELLED


def test_cancel_asks_a_running_execution_to_stop_and_leaves_a_finished_one(api):
    running = json.loads(api.post("/executions", {"code": "print(1)"}).body)["id"]
    done = json.loads(api.post("/executions", {"code": "print(2)"}).body)["id"]
    Execution.objects.filter(pk=running).update(status=Status.RUNNING)
    Execution.objects.filter(pk=done).update(status=Status.SUCCEEDED)
    body = json.loads(api.post(f"/executions/{running}/cancel").body)
    assert (body["status"], body["cancel_requested"]) == ("running", True)
    body = json.loads(api.post(f"/executions/{done}/cancel").body)
    assert (body["status"], body["cancel_requested"]) == ("succeeded", False)


@pytest.mark.parametrize(
    ("raw", "code", "field"),
    [
        (b"{not json", "invalid_json", None),
        (b"[]", "invalid_json", None),
        (b'"print(1)"', "invalid_json", None),
        (b"\xff\xfe", "invalid_json", None),
        (b'{"code": "print(1)", "timeout_s": NaN}', "invalid_json", None),
        (b"{}", "missing_field", "code"),
        (b'{"code": "print(1)", "owner": "globex"}', "unknown_field", "owner"),
        (b'{"code": 5}', "invalid_field", "code"),
        (b'{"code": "   "}', "invalid_field", "code"),
        (b'{"code": "print(1)\\u0000"}', "invalid_field", "code"),
        (b'{"code": "print(1)", "timeout_s": "5"}', "invalid_field", "timeout_s"),
        (b'{"code": "print(1)", "timeout_s": true}', "invalid_field", "timeout_s"),
        (b'{"code": "print(1)", "timeout_s": 0}', "invalid_field", "timeout_s"),
        (b'{"code": "print(1)", "timeout_s": 100000}', "invalid_field", "timeout_s"),
        (b'{"code": "print(1)", "memory_mb": 64.5}', "invalid_field", "memory_mb"),
        (b'{"code": "print(1)", "memory_mb": 8}', "invalid_field", "memory_mb"),
        (b'{"code": "print(1)", "wait": "yes"}', "invalid_field", "wait"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_creates_nothing(api, raw, code, field):
    answer = api.post("/executions", raw=raw)
    assert answer.status_code == 400, answer.body
    assert error(answer)["code"] == code
    assert error(answer).get("field") == field
    assert Execution.objects.count() == 0


def test_a_body_over_its_bound_is_refused_before_it_is_read(api, settings):
    settings.API_MAX_BODY_BYTES = 1024
    answer = api.post("/executions", {"code": "x = 1\n" * 400})
    assert answer.status_code == 413 and error(answer)["code"] == "too_large"
    assert Execution.objects.count() == 0


def test_a_body_that_is_not_json_is_refused(api):
    answer = api.post("/executions", raw=b"code=print(1)", content_type="application/x-www-form-urlencoded")
    assert answer.status_code == 415 and error(answer)["code"] == "unsupported_media_type"


def test_a_wrong_method_is_405_with_allow(api):
    answer = api.call("PUT", "/executions", {"code": "print(1)"})
    assert answer.status_code == 405 and answer["Allow"] == "POST"


def test_an_unknown_route_is_a_json_404(api):
    answer = api.client.get("/api/v1/nothing-here", headers={"Authorization": f"Bearer {api.key}"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"


# A stand-in for admission (the other half of issue 13 makes submit() raise these): the
# API must map any OwnerError by its own code, status and retry hint.
class NewRefusal(owner_errors.Refused):
    code = "brand_new_refusal"
    http_status = 503
    retry_after_s = 7


class PlainOwnerError(owner_errors.OwnerError):
    code = "some_owner_problem"


class BusyWithoutHint(owner_errors.OwnerError):
    code = "busy_without_hint"
    http_status = 429


@pytest.mark.parametrize(
    ("exc", "status", "code", "retry_after"),
    [
        (owner_errors.OwnerLimit("active 200 of 200"), 429, "owner_limit", "1"),
        (owner_errors.AtCapacity(), 503, "at_capacity", "1"),
        (owner_errors.QueueWaitExceeded(), 503, "queue_wait_exceeded", "1"),
        (NewRefusal("later"), 503, "brand_new_refusal", "7"),
        (owner_errors.OwnerDisabled("acme"), 400, "owner_disabled", None),
        (PlainOwnerError("no"), 400, "some_owner_problem", None),
        # A 429 or 503 always says when to come back, even when its error does not.
        (BusyWithoutHint("later"), 429, "busy_without_hint", "1"),
    ],
)
def test_any_owner_refusal_maps_to_its_code_status_and_retry_after(api, monkeypatch, exc, status, code, retry_after):
    from controlplane.executions import api as executions_api

    def refuse(*args, **kwargs):
        raise exc

    monkeypatch.setattr(executions_api, "submit", refuse)
    answer = api.post("/executions", {"code": "print(1)"})
    assert answer.status_code == status
    assert error(answer) == {"code": code, "message": str(exc)}
    assert answer.get("Retry-After") == retry_after


def test_wait_answers_202_with_the_execution_when_it_does_not_finish_in_time(api, settings):
    settings.API_EXECUTION_WAIT_MAX_S = 0.2
    answer = api.post("/executions", {"code": "print(1)", "wait": True})
    assert answer.status_code == 202 and json.loads(answer.body)["status"] == "queued"
    # Running out of time cancels nothing: the execution goes on.
    assert Execution.objects.get().status == Status.QUEUED
