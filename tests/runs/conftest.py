"""Helpers for the runs tests: a run walked to the state a test needs, and API calls
made through Django's test client exactly as the runner makes them."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from django.test import Client

from controlplane.runs import actions
from tests.support.owners import use_in_database_tests

SECRET = "s3cr3t-value-for-the-job"
JOB = {"kind": "shell", "command": "echo hi", "inputs": {"GREETING": "hello"}, "timeout_s": 60}


@dataclass
class RunnerCalls:
    """Calls one run's internal API the way the runner does."""

    client: Client
    run_id: str
    token: str = ""

    def call(
        self, method: str, endpoint: str, body: object = None, *, raw: bytes | None = None, token: str | None = None
    ):
        token = self.token if token is None else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        path = f"/internal/runs/{self.run_id}/{endpoint}"
        if method == "GET":
            return self.client.get(path, headers=headers)
        data = raw if raw is not None else json.dumps(body).encode()
        content_type = "application/octet-stream" if raw is not None else "application/json"
        return self.client.generic(method, path, data, content_type=content_type, headers=headers)

    def post(self, endpoint: str, body: object = None, **kw):
        return self.call("POST", endpoint, body, **kw)

    def get(self, endpoint: str, **kw):
        return self.call("GET", endpoint, **kw)

    def events(self, batch_key: str, *types: str):
        events = [
            {"type": t, "data": {"line": f"{t} {i}"}, "ts": "2026-01-01T00:00:00+00:00"} for i, t in enumerate(types)
        ]
        return self.post("events", {"batch_key": batch_key, "events": events})


def new_run(owner: str = "acme", secrets: dict | None = None):
    return actions.create_run(owner, JOB, {"API_TOKEN": SECRET} if secrets is None else secrets)


def launched(owner: str = "acme"):
    """A provisioning run and its launch key, as the launch task leaves them."""
    run = new_run(owner)
    claim = actions.claim_for_launch(run.id)
    return run, claim.launch_key


@pytest.fixture
def running(client):
    """A running run whose runner said hello: a RunnerCalls holding its session token."""
    run, key = launched()
    calls = RunnerCalls(client, str(run.id))
    answer = calls.post("hello", {"instance_id": "sandbox-1"}, token=key)
    assert answer.status_code == 200, answer.content
    calls.token = answer.json()["session_token"]
    calls.launch_key = key
    return calls


@pytest.fixture(autouse=True)
def _suite_owners(request):
    """Every test here may create runs for the suite's owners (tests/support/owners.py)."""
    use_in_database_tests(request)
