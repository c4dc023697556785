"""Why an owner's work is refused. Each error has a stable ``code`` the public API
returns and the Python API raises, and a text a person can act on."""

from __future__ import annotations


class OwnerError(ValueError):
    code = "owner_error"


class UnknownOwner(OwnerError):
    code = "unknown_owner"

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown owner {name!r}: create it with `manage.py create_owner {name}` or in the admin")


class OwnerDisabled(OwnerError):
    code = "owner_disabled"

    def __init__(self, name: str) -> None:
        super().__init__(f"owner {name!r} is disabled")


class Refused(OwnerError):
    """Work refused for now; the caller may retry after ``retry_after_s``."""

    code = "refused"
    http_status = 503
    retry_after_s = 1
    # The stable text a person reads; a detail (which cap, how many) follows it.
    text = "Code execution was refused for now. Please try again in a moment."

    def __init__(self, detail: str = "") -> None:
        super().__init__(f"{self.text} ({detail})" if detail else self.text)


class OwnerLimit(Refused):
    """One owner is over one of its caps (active, queued, live runs)."""

    code = "owner_limit"
    http_status = 429
    text = "Too many concurrent code executions. Please wait for some to complete before running more."


class StreamLimit(OwnerLimit):
    """One owner holds its share of a web process's event streams."""

    text = "Too many event streams open for this owner. Please close some before opening more."


class AtCapacity(Refused):
    """The whole deployment is full, whoever asks."""

    code = "at_capacity"
    http_status = 503
    text = "Code execution is at capacity. Please try again in a moment."


class QueueWaitExceeded(Refused):
    """Queued longer than the deployment lets work wait; it was not run."""

    code = "queue_wait_exceeded"
    http_status = 503
    text = "Code execution waited too long in the queue and was not run. Please try again."
