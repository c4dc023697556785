"""Validates a real response of the public API against docs/openapi.json: the route,
method and status must be documented, and a JSON body must match the schema the
description gives for that status (JSON Schema 2020-12, as OpenAPI 3.1 uses)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "docs" / "openapi.json"
BASE = "/api/v1"
SPEC_URI = "urn:holdfast:openapi"


@cache
def spec() -> dict:
    return json.loads(SPEC_PATH.read_text())


@cache
def registry() -> Registry:
    return Registry().with_resource(SPEC_URI, Resource.from_contents(spec(), default_specification=DRAFT202012))


def node_ref_parts(ref: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in ref.removeprefix("#/").split("/")]


def resolve(node: dict) -> dict:
    while "$ref" in node:
        target = spec()
        for part in node_ref_parts(node["$ref"]):
            target = target[part]
        node = target
    return node


def template_for(path: str) -> str | None:
    path = path.split("?", 1)[0]
    if not path.startswith(BASE):
        return None
    rest = path[len(BASE) :]
    for template in spec()["paths"]:
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, rest):
            return template
    return None


def validator(schema: dict) -> Draft202012Validator:
    if "$ref" in schema and schema["$ref"].startswith("#/"):
        schema = {"$ref": SPEC_URI + schema["$ref"]}
    return Draft202012Validator(schema, registry=registry(), format_checker=Draft202012Validator.FORMAT_CHECKER)


def documented_response(method: str, path: str, status: int) -> dict:
    template = template_for(path)
    assert template is not None, f"{path} is not a documented route"
    item = spec()["paths"][template]
    operation = item.get(method.lower())
    if operation is None:
        assert status == 405, f"{method} {template} is undocumented and answered {status}, not 405"
        return resolve(spec()["components"]["responses"]["MethodNotAllowed"])
    documented = operation["responses"]
    assert str(status) in documented, f"{method} {template} answered {status}, which it does not document"
    return resolve(documented[str(status)])


def check(method: str, path: str, status: int, content_type: str, body: bytes) -> None:
    """Fail unless this response is what docs/openapi.json says it may be."""
    response = documented_response(method, path, status)
    media = (content_type or "").split(";", 1)[0].strip()
    content = response.get("content", {})
    assert media in content, f"{method} {path} {status} answered {media!r}; documented: {sorted(content)}"
    if media == "application/json":
        validator(content[media]["schema"]).validate(json.loads(body))
