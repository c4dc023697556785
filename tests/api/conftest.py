"""Helpers for the public API tests: owners with keys, and a client that calls the API
as a service does (Bearer key, JSON body) and checks every answer it gets against
docs/openapi.json (openapi_check.py), so each test also proves the description true."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

import pytest
from django.test import Client

from controlplane.owners import keys
from controlplane.owners.models import Owner

from . import openapi_check

RUN_SECRET = "sk-live-do-not-show-4f1c2e"
JOB = {"kind": "shell", "command": "echo hi", "inputs": {"GREETING": "hello"}, "timeout_s": 60}
DEFAULT = object()


@dataclass
class Api:
    """One owner's view of the API."""

    client: Client
    owner: Owner
    key: str

    def call(self, method: str, path: str, body: object = None, *, key=DEFAULT, raw: bytes | None = None,
             headers: dict | None = None, content_type: str = "application/json"):  # fmt: skip
        key = self.key if key is DEFAULT else key
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        url = "/api/v1" + path
        if method == "GET":
            response = self.client.get(url, headers=sent)
        else:
            data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
            response = self.client.generic(method, url, data, content_type=content_type, headers=sent)
        content = b"".join(response.streaming_content) if response.streaming else response.content
        openapi_check.check(method, url, response.status_code, response.get("Content-Type", ""), content)
        response.body = content
        return response

    def get(self, path: str, **kw):
        return self.call("GET", path, **kw)

    def post(self, path: str, body: object = None, **kw):
        return self.call("POST", path, body, **kw)


def make_api(name: str, **fields) -> Api:
    owner = Owner.objects.create(name=name, **fields)
    _, raw = keys.create_key(owner, label="tests")
    # An address of its own: failed authentications are counted per address (in Redis,
    # across tests), and one test's refusals must not spend another's budget.
    address = "10.{}.{}.{}".format(*secrets.token_bytes(3))
    return Api(Client(REMOTE_ADDR=address), owner, raw)


@pytest.fixture
def api(db) -> Api:
    return make_api("acme")


@pytest.fixture
def other(db) -> Api:
    return make_api("globex")


def error(response) -> dict:
    return json.loads(response.body)["error"]
