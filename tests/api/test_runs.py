"""POST/GET /runs, cancel, events (the JSON page) and steering messages, on the rows: a
runner's calls are made through its own actions, as tests/runs does."""

from __future__ import annotations

import json
import uuid

import pytest

from controlplane.runs import actions
from controlplane.runs.models import Run, RunStatus, SteerMessage

from .conftest import JOB, RUN_SECRET, error

pytestmark = pytest.mark.django_db


def _create(api, **extra):
    answer = api.post("/runs", {"job": JOB, "secrets": {"API_TOKEN": RUN_SECRET}, **extra})
    assert answer.status_code == 202, answer.body
    return json.loads(answer.body)


def _running(api) -> str:
    run_id = _create(api)["id"]
    actions.claim_for_launch(run_id)
    actions.runner_hello(run_id, "sandbox-1")
    return run_id


def _events(run_id: str, batch: str, *lines: str) -> None:
    events = [actions.EventIn("stdout", {"line": line}, actions.timezone.now()) for line in lines]
    actions.append_events(run_id, batch, events)


def test_a_run_is_created_for_the_key_s_owner_and_its_launch_published(api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as published:
        body = _create(api, callback_url="https://hooks.example.com/holdfast?token=abc")
    run = Run.objects.get(pk=body["id"])
    assert (run.owner, run.status, run.secrets) == ("acme", RunStatus.QUEUED, {"API_TOKEN": RUN_SECRET})
    assert body["job"] == {**JOB} and body["status"] == "queued" and body["has_callback"] is True
    assert len(published) == 1  # launch_run, after commit


def test_secrets_and_the_callback_url_never_appear_in_an_answer(api):
    created = api.post(
        "/runs", {"job": JOB, "secrets": {"API_TOKEN": RUN_SECRET}, "callback_url": "https://h.example.com/?t=SEEKRIT"}
    )
    run_id = json.loads(created.body)["id"]
    answers = [created, api.get(f"/runs/{run_id}"), api.post(f"/runs/{run_id}/cancel"), api.get(f"/runs/{run_id}")]
    refused = api.post("/runs", {"job": JOB, "secrets": {"bad name": RUN_SECRET}})
    assert refused.status_code == 400
    for answer in [*answers, refused]:
        assert RUN_SECRET.encode() not in answer.body and b"SEEKRIT" not in answer.body


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({}, "missing_field", "job"),
        ({"job": "echo hi"}, "invalid_field", "job"),
        ({"job": {"kind": "perl", "command": "x"}}, "invalid_field", "job"),
        ({"job": {**JOB, "timeout_s": 0}}, "invalid_field", "job"),
        ({"job": JOB, "secrets": ["A"]}, "invalid_field", "secrets"),
        ({"job": JOB, "secrets": {"A": 1}}, "invalid_field", "secrets"),
        ({"job": JOB, "callback_url": "ftp://x"}, "invalid_field", "callback_url"),
        ({"job": JOB, "owner": "globex"}, "unknown_field", "owner"),
    ],
)
def test_bad_run_input_is_a_400_naming_the_field(api, body, code, field):
    answer = api.post("/runs", body)
    assert answer.status_code == 400 and (error(answer)["code"], error(answer)["field"]) == (code, field)
    assert Run.objects.count() == 0


def test_an_owner_reads_and_cancels_its_run(api):
    run_id = _running(api)
    assert json.loads(api.get(f"/runs/{run_id}").body)["status"] == "running"
    answer = api.post(f"/runs/{run_id}/cancel")
    assert answer.status_code == 200 and json.loads(answer.body)["status"] == "cancelled"
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.CANCELLED and run.key_revoked_at is not None and run.secrets == {}
    again = api.post(f"/runs/{run_id}/cancel")
    assert again.status_code == 200 and json.loads(again.body)["status"] == "cancelled"


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("POST", "/cancel", None),
        ("GET", "/events", None),
        ("POST", "/messages", {"kind": "interrupt"}),
    ],
)
def test_another_owner_s_run_is_not_found_and_left_alone(api, other, method, suffix, body):
    run_id = _running(api)
    answer = other.call(method, f"/runs/{run_id}{suffix}", body)
    assert answer.status_code == 404 and error(answer)["code"] == "not_found"
    assert json.loads(other.call(method, f"/runs/{uuid.uuid4()}{suffix}", body).body) == json.loads(answer.body)
    assert api.call(method, f"/runs/not-a-uuid{suffix}", body).status_code == 404
    assert Run.objects.get(pk=run_id).status == RunStatus.RUNNING
    assert SteerMessage.objects.count() == 0


def test_events_come_in_pages_after_a_seq(api):
    run_id = _running(api)
    _events(run_id, "b1", "one", "two", "three")
    page = json.loads(api.get(f"/runs/{run_id}/events?limit=2").body)
    assert [e["seq"] for e in page["events"]] == [1, 2] and page["next_after"] == 2
    assert page["events"][0]["data"] == {"line": "one"} and page["complete"] is False
    page = json.loads(api.get(f"/runs/{run_id}/events?after=2").body)
    assert [e["data"]["line"] for e in page["events"]] == ["three"] and page["next_after"] == 3
    empty = json.loads(api.get(f"/runs/{run_id}/events?after=3").body)
    assert empty["events"] == [] and empty["next_after"] == 3 and empty["complete"] is False
    actions.cancel_run(run_id)
    last = json.loads(api.get(f"/runs/{run_id}/events?after=3").body)
    assert [e["type"] for e in last["events"]] == ["result"] and last["complete"] is True
    assert last["run_status"] == "cancelled"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("after=-1", "after"),
        ("after=x", "after"),
        ("after=%C2%B2", "after"),
        ("limit=0", "limit"),
        ("limit=100000", "limit"),
        ("limit=%C2%B2", "limit"),
    ],
)
def test_a_bad_events_query_is_a_400_naming_it(api, query, field):
    run_id = _running(api)
    answer = api.get(f"/runs/{run_id}/events?{query}")
    assert answer.status_code == 400 and error(answer)["field"] == field


def test_a_steering_message_and_an_interrupt_reach_the_run(api):
    run_id = _running(api)
    steer = api.post(f"/runs/{run_id}/messages", {"kind": "steer", "body": "focus on tests"})
    interrupt = api.post(f"/runs/{run_id}/messages", {"kind": "interrupt"})
    assert (steer.status_code, interrupt.status_code) == (202, 202)
    rows = list(SteerMessage.objects.filter(run_id=run_id).values_list("id", "kind", "body"))
    assert rows == [
        (json.loads(steer.body)["id"], "steer", "focus on tests"),
        (json.loads(interrupt.body)["id"], "interrupt", ""),
    ]


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"kind": "steer"}, "invalid_field", "body"),
        ({"kind": "shout", "body": "x"}, "invalid_field", "kind"),
        ({"body": "x"}, "missing_field", "kind"),
        ({"kind": "steer", "body": 5}, "invalid_field", "body"),
        ({"kind": "steer", "body": "x", "urgent": True}, "unknown_field", "urgent"),
    ],
)
def test_a_bad_message_is_a_400_naming_the_field(api, body, code, field):
    run_id = _running(api)
    answer = api.post(f"/runs/{run_id}/messages", body)
    assert answer.status_code == 400 and (error(answer)["code"], error(answer)["field"]) == (code, field)
    assert SteerMessage.objects.count() == 0


def test_a_message_over_its_bound_is_refused(api, settings):
    settings.RUNS_STEER_MAX_BODY_BYTES = 300
    run_id = _running(api)
    answer = api.post(f"/runs/{run_id}/messages", {"kind": "steer", "body": "x" * 301})
    assert answer.status_code == 400 and error(answer)["field"] == "body"


def test_a_message_for_an_ended_run_is_refused_409(api):
    run_id = _running(api)
    actions.cancel_run(run_id)
    answer = api.post(f"/runs/{run_id}/messages", {"kind": "interrupt"})
    assert answer.status_code == 409 and error(answer)["code"] == "run_terminal"
    assert SteerMessage.objects.count() == 0


def test_no_log_line_carries_a_secret_or_a_key(api, caplog):
    caplog.set_level("DEBUG")
    run_id = _create(api)["id"]
    api.post("/runs", {"job": JOB, "secrets": {"bad name": RUN_SECRET}})
    api.post("/runs", {"job": {"kind": "shell"}, "secrets": {"API_TOKEN": RUN_SECRET}})
    api.post(f"/runs/{run_id}/messages", {"kind": "steer", "body": "x"})
    api.post(f"/runs/{run_id}/cancel")
    api.get(f"/runs/{run_id}", key=api.key[:-3] + "xyz")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert logged  # the requests above were logged (the 4xx at least), without these
    assert RUN_SECRET not in logged and api.key not in logged and api.key[:-3] not in logged
