"""One structured logging style for Holdfast's processes: stdlib ``logging``, one logfmt
line per event, the fields passed as data rather than formatted into the message.

    log = logging.getLogger("holdfast.pool")
    log.info("connection_opened", extra=fields(host_id=host_id, url=url))

is written as ``ts=1764496800.123 level=info logger=holdfast.pool
event=connection_opened host_id=h1 url=ws://...``. The control plane installs the
formatter through Django's ``LOGGING``, the host through ``configure`` (it has no
Django). The runner, which ships alone into the sandbox, keeps its own redacting
diagnostics (``runner/redact.py``).

A record of another library (no fields) keeps its message whole as the event, quoted.
Callers pass bounded scalars only (ids, counts, codes): never a token or a key.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

# The attribute ``fields()`` puts on a record (``extra``); namespaced so it cannot
# collide with what other libraries put there.
FIELDS_ATTR = "holdfast_fields"


def fields(**values: Any) -> dict[str, dict[str, Any]]:
    """``extra=`` for a logging call: ``log.info("event_name", extra=fields(k=v))``."""
    return {FIELDS_ATTR: values}


def quote(value: object) -> str:
    """A logfmt value: bare when it needs no quoting, else double-quoted and escaped."""
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n\\\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        return f'"{escaped}"'
    return text


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=... logger=... event=... key=value ...`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"ts={record.created:.3f}",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"event={quote(record.getMessage())}",
        ]
        for key, value in (getattr(record, FIELDS_ATTR, None) or {}).items():
            parts.append(f"{key}={quote(round(value, 3) if isinstance(value, float) else value)}")
        if record.exc_info:
            parts.append(f"exc={quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure(level: int | str = logging.INFO, stream: IO[str] | None = None) -> logging.Handler:
    """Send every record at ``level`` and above to ``stream`` (stderr) in logfmt: for a
    process without Django's ``LOGGING`` (the host)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler
