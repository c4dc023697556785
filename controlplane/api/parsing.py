"""Request bodies of the public API: bounded, strict, checked before any state changes.

A body is read only up to ``API_MAX_BODY_BYTES`` (plus one byte to see an overflow), so
an oversize request costs at most that much memory. It must be one JSON object whose
fields the route declares (``Field``): an unknown field, a missing required one or a
wrong type is a 400 that names the field. Booleans are never numbers here, though
Python counts ``True`` as an int. Values PostgreSQL's jsonb cannot store (NaN,
infinities, NUL, lone surrogates) are refused as 400, not met later as a 500.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from controlplane.bodies import read_limited, reject_constant

from .errors import InvalidField, InvalidJson, MissingField, TooLarge, UnknownField, UnsupportedMediaType

NUMBER = "number"
INTEGER = "integer"
STRING = "string"
BOOLEAN = "boolean"
OBJECT = "object"


@dataclass(frozen=True)
class Field:
    kind: str
    required: bool = False
    # Further checks of a well-typed value; returns the message of a 400, or None.
    check: Callable[[Any], str | None] | None = None


def _is(kind: str, value: Any) -> bool:
    if kind == BOOLEAN:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == NUMBER:
        return isinstance(value, int | float)
    if kind == INTEGER:
        return isinstance(value, int)
    if kind == STRING:
        return isinstance(value, str)
    if kind == OBJECT:
        return isinstance(value, dict)
    raise AssertionError(kind)


def read_body(request: HttpRequest) -> bytes:
    return read_limited(request, settings.API_MAX_BODY_BYTES, invalid=InvalidJson, too_large=TooLarge)


def _storable(value: Any, field: str, depth: int = 0) -> None:
    if depth > 32:
        raise InvalidField("nested too deeply", field=field)
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidField("strings may not contain NUL", field=field)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidField("strings must be valid Unicode", field=field) from None
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidField("numbers must be finite", field=field)
    elif isinstance(value, dict):
        for key, item in value.items():
            _storable(key, field, depth + 1)
            _storable(item, field, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _storable(item, field, depth + 1)


def json_body(request: HttpRequest, fields: dict[str, Field]) -> dict[str, Any]:
    """The body's fields, checked against ``fields``; absent optional fields are absent."""
    raw = read_body(request)
    content_type = request.content_type or ""
    if raw and content_type not in ("application/json", ""):
        raise UnsupportedMediaType()
    if not raw.strip():
        raw = b"{}"
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidJson() from None
    if not isinstance(body, dict):
        raise InvalidJson()
    for name in body:
        if name not in fields:
            raise UnknownField(name[:100])
    out: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in body:
            if spec.required:
                raise MissingField(name)
            continue
        value = body[name]
        if not _is(spec.kind, value):
            raise InvalidField(f"must be {'an' if spec.kind[0] in 'aeiou' else 'a'} {spec.kind}", field=name)
        _storable(value, name)
        if spec.check is not None:
            problem = spec.check(value)
            if problem:
                raise InvalidField(problem, field=name)
        out[name] = value
    return out
