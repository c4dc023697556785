"""One timing unit for tests (STYLE habit 7). ``HOLDFAST_TEST_TIME_FACTOR`` scales how
long a test *waits* on a slow machine; it never changes what a test asserts."""

import os
import time
from collections.abc import Callable

FACTOR = float(os.environ.get("HOLDFAST_TEST_TIME_FACTOR", "1") or 1)


def scaled(seconds: float) -> float:
    return seconds * FACTOR


def wait_until(
    predicate: Callable[[], object], *, timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail after the scaled timeout."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {scaled(timeout):.1f}s waiting for {what or predicate}")
        time.sleep(interval)
