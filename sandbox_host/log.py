"""Structured logs: one logfmt line per event on stderr (``holdfast_wire.logfmt``, the
style every Holdfast process writes), through stdlib ``logging``.

``log(event, **fields)`` passes the fields as data. Callers pass bounded scalars only
(ids, counts, codes); a token is never a field. ``python -m sandbox_host`` installs the
handler (``configure``); a record logged before that, or in a process that never
installs it, follows that process's own logging setup.
"""

from __future__ import annotations

import logging

from holdfast_wire.logfmt import configure, fields

logger = logging.getLogger("holdfast.host")

__all__ = ["configure", "log", "logger"]


def log(event: str, *, level: str = "info", **values: object) -> None:
    """Write one event: ``ts=... level=info logger=holdfast.host event=NAME k=v ...``;
    ``level`` is the record's level name (``"warning"``), not a field."""
    logger.log(logging.getLevelName(level.upper()), event, extra=fields(**values))
