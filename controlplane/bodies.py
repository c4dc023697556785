"""Reading a request body within a limit, for the runner API and the public API alike:
a declared length over the limit is refused before reading, and at most limit + 1 bytes
are read whatever the client declared (a missing or lying Content-Length)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def read_limited(request: HttpRequest, limit: int, *, invalid: type[Exception], too_large: type[Exception]) -> bytes:
    """The body, or ``invalid(message)`` for a Content-Length that is not a number and
    ``too_large(limit)`` past ``limit`` bytes."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise invalid("invalid Content-Length") from None
    if declared > limit:
        raise too_large(limit)
    data = request.read(limit + 1)
    if len(data) > limit:
        raise too_large(limit)
    return data


def reject_constant(name: str) -> Any:
    """``json.loads(parse_constant=...)``: NaN and Infinity are not JSON."""
    raise ValueError(name)
