"""The runner's log: stdlib ``logging`` in the one logfmt style of Holdfast's processes
(``holdfast_wire.logfmt``, bound read-only into a run's sandbox next to the runner), on
stderr, which the host keeps in ``<state dir>/runs/<run id>.log``.

Every finished line goes through the run's redactor (``use_redactor``, once the key is
known) before it is written: a value that slipped past ``diagnostic_fields``, or a
secret spanning two fields, still leaves nothing behind.

    log.warning("events_truncated", extra=fields(events_dropped=3))
"""

from __future__ import annotations

import logging
import sys

from holdfast_wire.logfmt import FIELDS_ATTR, LogfmtFormatter, fields
from runner.redact import Redactor

__all__ = ["fields", "log", "use_redactor"]

log = logging.getLogger("holdfast.runner")
_LOGFMT = LogfmtFormatter()
_handler = logging.StreamHandler(sys.stderr)
# The filter below writes the finished, redacted line into the record's message.
_handler.setFormatter(logging.Formatter("%(message)s"))
log.addHandler(_handler)
log.setLevel(logging.INFO)
# The runner's lines are its own: a root handler (a test's, a library's) never doubles them.
log.propagate = False


def use_redactor(redactor: Redactor) -> None:
    """Redact every line from now on with ``redactor`` (the run's key and secrets)."""

    def redact(record: logging.LogRecord) -> bool:
        # stderr as it is now (a test may have replaced it), never the one of import time.
        _handler.stream = sys.stderr
        record.msg, record.args = redactor.text(_LOGFMT.format(record)), None
        setattr(record, FIELDS_ATTR, None)
        record.exc_info = record.exc_text = None
        return True

    for old in list(_handler.filters):
        _handler.removeFilter(old)
    _handler.addFilter(redact)


# Before the key is known: the patterns every redactor knows (bearer tokens, JWTs, values
# after labels such as password or token).
use_redactor(Redactor(()))
