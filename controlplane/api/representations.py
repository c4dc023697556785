"""What the public API shows of an execution, a run and an event (docs/openapi.json,
components/schemas). Built from an allowlist of fields: a run's ``secrets``, its key
hashes and salts, and an execution's code are never shown."""

from __future__ import annotations

from datetime import datetime

from controlplane.executions.models import Execution
from controlplane.runs.models import Run, RunEvent


def time(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def execution(row: Execution) -> dict:
    return {
        "id": str(row.pk),
        "status": row.status,
        "stdout": row.stdout,
        "stderr": row.stderr,
        "exit_code": row.exit_code,
        "error": row.error,
        "duration_ms": row.duration_ms,
        "timeout_s": row.timeout_ms / 1000,
        "memory_mb": row.memory_mb,
        "cancel_requested": row.cancel_requested_at is not None,
        "created_at": time(row.created_at),
        "started_at": time(row.started_at),
        "finished_at": time(row.finished_at),
    }


def run(row: Run) -> dict:
    job = row.job or {}
    return {
        "id": str(row.pk),
        "status": row.status,
        # The job as submitted (kind, command or source, inputs, timeout): never secrets,
        # which live in their own column and are wiped when the run ends.
        "job": {k: job[k] for k in ("kind", "command", "source", "inputs", "timeout_s") if k in job},
        "exit_code": row.exit_code,
        # Redacted against the run's secrets when it was written (runs/actions.py _finish).
        "error": row.error,
        "summary": row.summary or {},
        # Whether progress notifications go out; not the URL, which may carry a token.
        "has_callback": bool(row.callback_url),
        "created_at": time(row.created_at),
        "started_at": time(row.started_at),
        "finished_at": time(row.finished_at),
    }


def event(row: RunEvent) -> dict:
    return {"seq": row.seq, "type": row.type, "data": row.data, "ts": time(row.ts)}
