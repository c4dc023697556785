"""The one backoff schedule of every loop that retries or polls (the pool's connects and
busy hosts, the host's reserve, the results listener, a worker's database patience,
``execute``'s polling of its row): exponential, capped.

``delay`` is a pure function; ``wait`` is the only place that sleeps, and its sleeper
and clock are injected so tests of a retrying loop run instantly. (The runner keeps its
own jittered copy in ``runner/backoff.py``: it is stdlib only and ships alone into the
sandbox. Celery tasks retry with Celery's ``retry_backoff``/``retry_jitter``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable


def delay(attempt: int, *, first_s: float, max_s: float, factor: float = 2.0) -> float:
    """Seconds to wait before retry ``attempt`` (counting from 0): ``first_s`` times
    ``factor`` per attempt (doubled by default), never more than ``max_s``."""
    if attempt < 0:
        raise ValueError("attempt counts from 0")
    # Past 64 attempts any growth has long reached the cap (and a float power could
    # overflow).
    return max_s if attempt >= 64 else min(max_s, first_s * (factor**attempt))


def wait(
    attempt: int,
    *,
    first_s: float,
    max_s: float,
    factor: float = 2.0,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> bool:
    """Sleep ``delay(attempt)``; False, without sleeping, when that would pass
    ``deadline`` (a ``clock()`` value): the caller gives up instead."""
    seconds = delay(attempt, first_s=first_s, max_s=max_s, factor=factor)
    if deadline is not None and clock() + seconds > deadline:
        return False
    sleep(seconds)
    return True
