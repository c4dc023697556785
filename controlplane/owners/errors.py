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
