"""docs/openapi.json is what /api/v1/openapi.json serves, is a valid description, and
names every route the URL map has. (Every response the API tests get is validated
against it as they go: conftest.Api and openapi_check.)"""

from __future__ import annotations

import json

import pytest
from django.urls import get_resolver
from jsonschema import Draft202012Validator

from . import openapi_check


@pytest.mark.django_db
def test_the_description_is_served_without_a_key(client):
    answer = client.get("/api/v1/openapi.json")
    assert answer.status_code == 200 and answer.json() == openapi_check.spec()


def test_every_schema_is_valid_json_schema_and_every_ref_resolves():
    spec = openapi_check.spec()
    assert spec["openapi"].startswith("3.1")
    for schema in spec["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    refs = []

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec)
    for ref in refs:
        assert openapi_check.resolve({"$ref": ref}), ref


def _routes() -> set[str]:
    resolver = get_resolver()
    api = next(p for p in resolver.url_patterns if str(p.pattern) == "api/v1/")
    found = set()
    for pattern in api.url_patterns:
        text = str(pattern.pattern)
        if text.startswith("^"):  # the JSON 404 catch-all
            continue
        found.add("/" + text.replace("<str:", "{").replace(">", "}"))
    return found


def test_every_route_is_described_and_every_description_is_a_route():
    assert _routes() == set(openapi_check.spec()["paths"])


def test_a_response_that_breaks_the_description_is_caught():
    # The checker itself must fail on a wrong body, or every validation above proves nothing.
    with pytest.raises(Exception, match="required property"):
        openapi_check.check("GET", "/api/v1/executions/x", 200, "application/json", json.dumps({"id": "x"}).encode())
    with pytest.raises(AssertionError, match="does not document"):
        openapi_check.check("GET", "/api/v1/executions/x", 418, "application/json", b"{}")


@pytest.mark.parametrize(
    ("schema", "fields"),
    [
        ("ExecutionCreate", "controlplane.api.executions_views:FIELDS"),
        ("RunCreate", "controlplane.api.runs_views:RUN_FIELDS"),
        ("MessageCreate", "controlplane.api.runs_views:MESSAGE_FIELDS"),
    ],
)
def test_each_request_body_is_described_as_the_code_parses_it(schema, fields):
    import importlib

    module, name = fields.split(":")
    parsed = getattr(importlib.import_module(module), name)
    described = openapi_check.spec()["components"]["schemas"][schema]
    assert set(described["properties"]) == set(parsed)
    assert set(described.get("required", [])) == {k for k, f in parsed.items() if f.required}
    assert described["additionalProperties"] is False  # unknown fields are refused
    for key, field in parsed.items():
        kind = openapi_check.resolve(described["properties"][key]).get("type")
        assert kind == field.kind, (key, kind, field.kind)
