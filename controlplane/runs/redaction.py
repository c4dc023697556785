"""The control plane's side of redaction: one ``runner.redact.Redactor`` per run.

Anything the control plane writes outside a run's event stream (the row's error text and
summary, log lines, command output) goes through the redactor built here, which knows the
run's injected secrets and every key the run could hold (re-derived, never stored).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.redact import Redactor, diagnostic_fields

from . import credentials
from .models import Run


def run_redactor(run: Run) -> Redactor:
    secrets = [v for v in (run.secrets or {}).values() if isinstance(v, str)]
    keys = [credentials.derive(credentials.LAUNCH, str(run.id), run.token_salt)]
    if run.instance_id:
        keys.append(credentials.derive(credentials.SESSION, str(run.id), run.token_salt, run.instance_id))
    return Redactor(secrets, keys=keys)


def diagnostic(run: Run, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A log line's fields about ``run``: allowlisted scalars, redacted (DESIGN.md)."""
    return diagnostic_fields({"run_id": str(run.id), **fields}, run_redactor(run))
