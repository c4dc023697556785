"""One log line per interval for an event that a flood of requests repeats (every
refused submit of a full deployment), with the number of repeats it left out: the
operator sees the state and its rate, and the log does not grow with the flood."""

from __future__ import annotations

import logging
import threading
import time

from holdfast_wire.logfmt import fields


class Throttled:
    def __init__(self, logger: logging.Logger, event: str, every_s: float) -> None:
        self.logger, self.event, self.every_s = logger, event, every_s
        self._lock = threading.Lock()
        self._next = 0.0
        self._left_out = 0

    def warning(self, **values: object) -> None:
        """Log ``event`` with ``values`` and ``left_out`` (the repeats since the last
        line), unless a line went out less than ``every_s`` ago."""
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._left_out += 1
                return
            left_out, self._left_out = self._left_out, 0
            self._next = now + self.every_s
        self.logger.warning(self.event, extra=fields(**values, left_out=left_out))
