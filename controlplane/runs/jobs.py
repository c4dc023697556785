"""What a run's job and its secrets may look like; everything else is refused up front.

A job is ``{"kind": "shell", "command": str}`` or ``{"kind": "python", "source": str}``,
plus ``inputs`` (names to strings) and ``timeout_s`` (whole seconds). Secrets are
environment variables for the job: names to strings.
"""

from __future__ import annotations

import re

from django.conf import settings

from .errors import BadRequest

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Limits
MAX_OWNER_CHARS = 200
MAX_CODE_CHARS = 256 * 1024  # a command or a script, not a data file
MAX_INPUTS = 100
MAX_VALUE_CHARS = 64 * 1024  # one input or secret value


def _text(value: object, what: str, *, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise BadRequest(f"{what} must be a non-empty string of at most {limit} characters")
    return value


def _env(mapping: object, what: str) -> dict[str, str]:
    if not isinstance(mapping, dict) or len(mapping) > MAX_INPUTS:
        raise BadRequest(f"{what} must be an object of at most {MAX_INPUTS} entries")
    for name, value in mapping.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise BadRequest(f"{what} names must look like environment variable names")
        if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS or "\x00" in value:
            raise BadRequest(f"{what} values must be strings of at most {MAX_VALUE_CHARS} characters")
    return dict(mapping)


def validate_owner(owner: object) -> str:
    return _text(owner, "owner", limit=MAX_OWNER_CHARS)


def validate_secrets(secrets: object) -> dict[str, str]:
    return _env(secrets, "secrets")


def validate_job(job: object) -> dict:
    if not isinstance(job, dict):
        raise BadRequest("job must be an object")
    kind = job.get("kind")
    if kind == "shell":
        body = {"command": _text(job.get("command"), "command", limit=MAX_CODE_CHARS)}
    elif kind == "python":
        body = {"source": _text(job.get("source"), "source", limit=MAX_CODE_CHARS)}
    else:
        raise BadRequest("job kind must be 'shell' or 'python'")
    timeout = job.get("timeout_s", settings.RUNS_DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= settings.RUNS_MAX_TIMEOUT_S:
        raise BadRequest(f"timeout_s must be whole seconds from 1 to {settings.RUNS_MAX_TIMEOUT_S}")
    return {"kind": kind, **body, "inputs": _env(job.get("inputs", {}), "inputs"), "timeout_s": timeout}
