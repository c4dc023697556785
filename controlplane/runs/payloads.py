"""Parsing the runner's request bodies: bounded, strict, and before any state changes.

A body is read only up to its limit (plus one byte to detect overflow), so an oversize
request costs at most the limit in memory. JSON must be an object of the expected shape;
values PostgreSQL's jsonb could not store (NaN, infinities, NUL, lone surrogates) are
refused here as 400 rather than failing later as a 500.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone

from controlplane.bodies import read_limited, reject_constant

from .actions import EventIn
from .errors import BadRequest, TooLarge

# Limits
MAX_KEY_CHARS = 128  # batch keys, request keys, instance ids
MAX_EVENT_TYPE_CHARS = 64
RESULT_STATUSES = ("succeeded", "failed", "cancelled")


def read_body(request: HttpRequest, limit: int) -> bytes:
    return read_limited(request, limit, invalid=BadRequest, too_large=TooLarge)


def _check_storable(value: Any, depth: int = 0) -> None:
    if depth > 64:
        raise BadRequest("JSON nested too deeply")
    if isinstance(value, str):
        if "\x00" in value:
            raise BadRequest("strings may not contain NUL")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("strings must be valid Unicode") from None
    elif isinstance(value, float) and not math.isfinite(value):
        raise BadRequest("numbers must be finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_storable(key, depth + 1)
            _check_storable(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_storable(item, depth + 1)


def json_object(raw: bytes) -> dict:
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(value, dict):
        raise BadRequest("body must be a JSON object")
    _check_storable(value)
    return value


def _key(body: dict, name: str, *, limit: int = MAX_KEY_CHARS) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise BadRequest(f"{name} must be a non-empty string of at most {limit} characters")
    return value


def parse_hello(request: HttpRequest) -> str:
    return _key(json_object(read_body(request, settings.RUNS_MAX_SMALL_BODY_BYTES)), "instance_id")


def _timestamp(value: object) -> datetime:
    if value is None:
        return timezone.now()
    if not isinstance(value, str) or len(value) > 64:
        raise BadRequest("event ts must be an ISO 8601 string")
    try:
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise BadRequest("event ts must be an ISO 8601 string") from None


def parse_events(request: HttpRequest) -> tuple[str, list[EventIn]]:
    body = json_object(read_body(request, settings.RUNS_MAX_EVENTS_BODY_BYTES))
    batch_key = _key(body, "batch_key")
    events = body.get("events")
    if not isinstance(events, list) or not events:
        raise BadRequest("events must be a non-empty list")
    if len(events) > settings.RUNS_MAX_EVENTS_PER_BATCH:
        raise TooLarge(settings.RUNS_MAX_EVENTS_PER_BATCH, "events batch")
    parsed = []
    for event in events:
        if not isinstance(event, dict):
            raise BadRequest("each event must be an object")
        data = event.get("data", {})
        if not isinstance(data, dict):
            raise BadRequest("event data must be an object")
        sent_ts = event.get("ts")
        kind = _key(event, "type", limit=MAX_EVENT_TYPE_CHARS)
        parsed.append(EventIn(kind, data, _timestamp(sent_ts), sent_ts))
    return batch_key, parsed


def parse_result(request: HttpRequest) -> dict:
    body = json_object(read_body(request, settings.RUNS_MAX_RESULT_BODY_BYTES))
    status = body.get("status")
    if status not in RESULT_STATUSES:
        raise BadRequest(f"status must be one of {', '.join(RESULT_STATUSES)}")
    exit_code = body.get("exit_code")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise BadRequest("exit_code must be an integer or null")
    if exit_code is not None and not -(2**31) <= exit_code < 2**31:
        raise BadRequest("exit_code out of range")
    error = body.get("error", "")
    if not isinstance(error, str):
        raise BadRequest("error must be a string")
    summary = body.get("summary", {})
    if not isinstance(summary, dict):
        raise BadRequest("summary must be an object")
    return {"status": status, "exit_code": exit_code, "error": error, "summary": summary}
