"""The runs app's error tree, and the code each error carries to the HTTP edge.

::

    RunsError                      code            HTTP
    ├── Unauthorized               unauthorized    401  bearer missing, wrong or revoked
    ├── RunNotFound                not_found       404  no such run (or a forged id)
    ├── MethodNotAllowed           method_not_allowed 405
    ├── BadRequest                 bad_request     400  malformed JSON or fields
    │   └── BadAck                 bad_ack         400  an ack refused whole (steer)
    ├── TooLarge                   too_large       413  body or batch over its bound
    ├── RateLimited                rate_limited    429  too many requests (carries Retry-After)
    └── Conflict                                   409
        ├── RunTerminal            run_terminal         the run already ended (carries its status)
        ├── InstanceConflict       instance_conflict    another runner instance said hello
        ├── BatchKeyConflict       batch_key_conflict   a batch key reused for other events
        └── EventsTruncated        events_truncated     the run's event quota or event size limit was hit

Messages are fixed text written here or field names: never a value the caller sent,
so no secret can travel back in an error body or into a log line.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BAD_REQUEST = "bad_request"
    TOO_LARGE = "too_large"
    RUN_TERMINAL = "run_terminal"
    INSTANCE_CONFLICT = "instance_conflict"
    BATCH_KEY_CONFLICT = "batch_key_conflict"
    EVENTS_TRUNCATED = "events_truncated"
    RATE_LIMITED = "rate_limited"
    BAD_ACK = "bad_ack"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.RUN_TERMINAL: 409,
    ErrorCode.INSTANCE_CONFLICT: 409,
    ErrorCode.BATCH_KEY_CONFLICT: 409,
    ErrorCode.EVENTS_TRUNCATED: 409,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.BAD_ACK: 400,
}


class RunsError(Exception):
    code: ErrorCode = ErrorCode.BAD_REQUEST
    default_message = "request refused"

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.default_message
        super().__init__(self.message)

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def body(self) -> dict:
        return {"error": {"code": str(self.code), "message": self.message}}


class Unauthorized(RunsError):
    code = ErrorCode.UNAUTHORIZED
    default_message = "missing or invalid credentials"


class RunNotFound(RunsError):
    code = ErrorCode.NOT_FOUND
    default_message = "no such run"


class MethodNotAllowed(RunsError):
    code = ErrorCode.METHOD_NOT_ALLOWED
    default_message = "method not allowed"

    def __init__(self, allowed: list[str]) -> None:
        self.allowed = allowed
        super().__init__(f"allowed: {', '.join(allowed)}")


class BadRequest(RunsError):
    code = ErrorCode.BAD_REQUEST
    default_message = "malformed request"


class TooLarge(RunsError):
    code = ErrorCode.TOO_LARGE
    default_message = "request too large"

    def __init__(self, limit: int, what: str = "body") -> None:
        self.limit = limit
        super().__init__(f"{what} over its limit of {limit}")


class Conflict(RunsError):
    code = ErrorCode.RUN_TERMINAL  # overridden by every leaf


class RunTerminal(Conflict):
    code = ErrorCode.RUN_TERMINAL
    default_message = "the run has ended; its keys are revoked"

    def __init__(self, status: str) -> None:
        self.status = status
        super().__init__()

    def body(self) -> dict:
        # The recorded verdict rides along so a runner replaying its result can tell
        # "mine was recorded" from "another verdict won" without another call.
        return {**super().body(), "status": self.status}


class InstanceConflict(Conflict):
    code = ErrorCode.INSTANCE_CONFLICT
    default_message = "another runner instance already claimed this run"


class BatchKeyConflict(Conflict):
    code = ErrorCode.BATCH_KEY_CONFLICT
    default_message = "this batch key was already used for different events"


class EventsTruncated(Conflict):
    """The run reached its event quota or sent an event over the size limit: it got one
    ``events_truncated`` event, and every later batch is refused with this code. The
    runner stops sending events and keeps the job running."""

    code = ErrorCode.EVENTS_TRUNCATED
    default_message = "the run's events are truncated: no more events are accepted"


class RateLimited(RunsError):
    """Too many requests for one run key or one client address; ``retry_after_s`` is
    sent as ``Retry-After``, which the runner's transport honours."""

    code = ErrorCode.RATE_LIMITED
    default_message = "too many requests; retry after the Retry-After seconds"

    def __init__(self, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__()


class BadAck(BadRequest):
    """The steer poll's acknowledgement, refused whole: nothing was marked."""

    code = ErrorCode.BAD_ACK
    default_message = "acknowledgement refused: ids must be well-formed, of this run, and few enough"
