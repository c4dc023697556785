"""Structured logs: one ``key=value`` line per event on stderr.

Callers pass bounded scalars only (ids, counts, codes); a token is never a field.
"""

from __future__ import annotations

import sys
import threading
import time

_lock = threading.Lock()


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def log(event: str, **fields: object) -> None:
    """Write one event line: ``ts=... event=NAME k=v ...``."""
    parts = [f"ts={time.time():.3f}", f"event={event}"]
    parts += [f"{key}={_quote(value)}" for key, value in fields.items()]
    line = " ".join(parts) + "\n"
    with _lock:
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: logging must never kill the host
            pass
