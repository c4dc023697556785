"""The public API's error tree, and the code and HTTP status each error carries.

::

    ApiError                     code                     HTTP
    ├── Unauthenticated          unauthorized             401  key missing, malformed, wrong, revoked
    ├── NotFound                 not_found                404  no such route, or not this owner's id
    ├── MethodNotAllowed         method_not_allowed       405  (carries Allow)
    ├── BadRequest               (per leaf)               400  names the ``field``
    │   ├── InvalidJson          invalid_json                  body is not one JSON object
    │   ├── UnknownField         unknown_field                 a field the route does not take
    │   ├── MissingField         missing_field                 a required field is absent
    │   └── InvalidField         invalid_field                 wrong type or out of range
    ├── TooLarge                 too_large                413  body over API_MAX_BODY_BYTES
    ├── UnsupportedMediaType     unsupported_media_type   415  a body that is not JSON
    ├── IdempotencyKeyReused     idempotency_key_reused   422  same key, other request
    ├── RunTerminal              run_terminal             409  the run has ended (steering)
    ├── RateLimited              rate_limited             429  (carries Retry-After)
    └── TooManyStreams           too_many_streams         503  (carries Retry-After)

An owner's refusal (``controlplane.owners.errors.OwnerError``: ``owner_limit`` 429,
``at_capacity`` 503, ``queue_wait_exceeded``, ``owner_disabled``, ...) is not copied
here: ``owner_error`` turns any of them into the same body with the error's own
``code``, its ``http_status`` (400 when it has none) and ``Retry-After`` on 429/503, so
a refusal added in ``owners/errors.py`` reaches the API without a change here.

Messages are fixed text or field names, never a value the caller sent, so no secret
(a run's secrets, an API key) travels back in an error body or into a log line.
"""

from __future__ import annotations

import math
from enum import StrEnum

from django.http import JsonResponse


class ErrorCode(StrEnum):
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INVALID_JSON = "invalid_json"
    UNKNOWN_FIELD = "unknown_field"
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"
    TOO_LARGE = "too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    RUN_TERMINAL = "run_terminal"
    RATE_LIMITED = "rate_limited"
    TOO_MANY_STREAMS = "too_many_streams"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.UNKNOWN_FIELD: 400,
    ErrorCode.MISSING_FIELD: 400,
    ErrorCode.INVALID_FIELD: 400,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.IDEMPOTENCY_KEY_REUSED: 422,
    ErrorCode.RUN_TERMINAL: 409,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.TOO_MANY_STREAMS: 503,
}


class ApiError(Exception):
    code: ErrorCode = ErrorCode.INVALID_FIELD
    default_message = "request refused"

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        self.message = message or self.default_message
        self.field = field
        super().__init__(self.message)

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def response(self) -> JsonResponse:
        return error_response(str(self.code), self.message, self.http_status, field=self.field)


class Unauthenticated(ApiError):
    code = ErrorCode.UNAUTHORIZED
    default_message = "missing or invalid API key: send Authorization: Bearer <key>"

    def response(self) -> JsonResponse:
        response = super().response()
        # RFC 6750 section 3: a 401 names the scheme the client should use.
        response["WWW-Authenticate"] = 'Bearer realm="holdfast"'
        return response


class NotFound(ApiError):
    code = ErrorCode.NOT_FOUND
    default_message = "not found"


class MethodNotAllowed(ApiError):
    code = ErrorCode.METHOD_NOT_ALLOWED

    def __init__(self, allowed: list[str]) -> None:
        self.allowed = allowed
        super().__init__(f"allowed: {', '.join(allowed)}")

    def response(self) -> JsonResponse:
        response = super().response()
        response["Allow"] = ", ".join(self.allowed)
        return response


class BadRequest(ApiError):
    code = ErrorCode.INVALID_FIELD


class InvalidJson(BadRequest):
    code = ErrorCode.INVALID_JSON
    default_message = "the body must be one JSON object"


class UnknownField(BadRequest):
    code = ErrorCode.UNKNOWN_FIELD

    def __init__(self, field: str) -> None:
        super().__init__("this route does not take this field", field=field)


class MissingField(BadRequest):
    code = ErrorCode.MISSING_FIELD

    def __init__(self, field: str) -> None:
        super().__init__("this field is required", field=field)


class InvalidField(BadRequest):
    code = ErrorCode.INVALID_FIELD


class TooLarge(ApiError):
    code = ErrorCode.TOO_LARGE

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is over its limit of {limit} bytes")


class UnsupportedMediaType(ApiError):
    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE
    default_message = "send the body as Content-Type: application/json"


class IdempotencyKeyReused(ApiError):
    code = ErrorCode.IDEMPOTENCY_KEY_REUSED
    default_message = "this Idempotency-Key was already used for a different request"

    def __init__(self) -> None:
        super().__init__(field="Idempotency-Key")


class RunTerminal(ApiError):
    code = ErrorCode.RUN_TERMINAL

    def __init__(self, status: str) -> None:
        super().__init__(f"the run has ended ({status})")


class Retryable(ApiError):
    """Refused for now; ``retry_after_s`` is sent as ``Retry-After``."""

    def __init__(self, retry_after_s: float, message: str | None = None) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)

    def response(self) -> JsonResponse:
        return error_response(str(self.code), self.message, self.http_status, retry_after_s=self.retry_after_s)


class RateLimited(Retryable):
    code = ErrorCode.RATE_LIMITED
    default_message = "too many requests; retry after the Retry-After seconds"


class TooManyStreams(Retryable):
    code = ErrorCode.TOO_MANY_STREAMS
    default_message = "this server is serving as many event streams as it may; retry after the Retry-After seconds"


def error_response(
    code: str, message: str, status: int, *, field: str | None = None, retry_after_s: float | None = None
) -> JsonResponse:
    error: dict = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    response = JsonResponse({"error": error}, status=status)
    if retry_after_s is not None:
        # Whole seconds (RFC 9110 section 10.2.3), at least 1.
        response["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return response


def owner_error(exc: Exception) -> JsonResponse:
    """Any ``OwnerError``, with the status and retry hint the error itself carries."""
    status = int(getattr(exc, "http_status", 400) or 400)
    retry = getattr(exc, "retry_after_s", None) if status in (429, 503) else None
    if status in (429, 503) and retry is None:
        retry = 1  # a 429/503 always says when to come back
    return error_response(str(getattr(exc, "code", "owner_error")), str(exc), status, retry_after_s=retry)
