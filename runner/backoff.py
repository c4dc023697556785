"""Retry timing for the runner's transport: every constant in one place, and pure functions.

Nothing here sleeps or reads a clock; ``runner.transport`` is the one place that does, with
an injected sleeper and clock (STYLE habit 2). The numbers follow DESIGN.md (Runs, runner
transport) and the seed it grew from.
"""

from __future__ import annotations

import email.utils
import math

# Timeouts
# The outage budget is wall time the runner keeps retrying one call through an outage,
# spent in full. 180 s outlasts a rolling deploy or a restart of the web process.
DEFAULT_OUTAGE_BUDGET_S = 180.0
# The result is the run's verdict: losing it loses the run, so it gets longer (300 s).
DEFAULT_RESULT_OUTAGE_BUDGET_S = 300.0
# First backoff window 0.5 s: long enough that a refused connect is not hammered, short
# enough that a blip costs well under a second.
DEFAULT_BACKOFF_BASE_S = 0.5
# Largest backoff window 10 s: an outage's end is noticed within ~10 s of it.
DEFAULT_BACKOFF_MAX_S = 10.0
# 429 without a usable Retry-After waits 1 s: the limiter counts per minute, so a
# second is the smallest pause that lets it recover.
DEFAULT_RATE_LIMIT_WAIT_S = 1.0
# A Retry-After larger than 60 s on 429 is capped: a runner must not idle for minutes on
# one header; the count limit below still ends a limiter that never relents.
DEFAULT_RATE_LIMIT_WAIT_MAX_S = 60.0
# Connect timeout 5 s: a control plane that does not accept in 5 s is down for our purposes,
# and a connect timeout proves nothing reached a handler, so the call is retried.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# Read timeout 60 s: longer than the slowest handler (a large events batch), and a
# stalled read is ambiguous, so only replay-safe endpoints try again.
DEFAULT_READ_TIMEOUT_S = 60.0

# Limits
# One retry is always granted for a network failure even with the budget spent, so one
# stalled attempt (a connect or read timeout) cannot eat the whole budget on its own.
GUARANTEED_NETWORK_RETRIES = 1
# 429 is retried at most 8 times (9 attempts): the limiter answers before any handler
# runs, so replay is safe, but a limiter that never relents must still end the call.
DEFAULT_RATE_LIMIT_RETRIES = 8
# Gateway and server errors that a restart or a proxy in front of a restarting control
# plane produces; anything else from the 5xx range (501, 505) is a real answer.
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})


def backoff_delay(
    retry: int,
    random_value: float,
    *,
    base_s: float = DEFAULT_BACKOFF_BASE_S,
    max_s: float = DEFAULT_BACKOFF_MAX_S,
) -> float:
    """Equal jitter over an exponential window: half the window fixed, half random.

    ``retry`` counts from 0; ``random_value`` is in [0, 1). The fixed half is the floor
    that keeps a fleet of runners from retrying in lockstep without ever dropping to zero.
    """
    if retry < 0:
        raise ValueError("retry counts from 0")
    # min() before the power would overflow: 2**1100 is fine for int, not for float.
    window = max_s if retry >= 64 else min(max_s, base_s * (2**retry))
    return window / 2 + min(max(random_value, 0.0), 1.0) * window / 2


def parse_retry_after(value: str | None, *, now_epoch_s: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if absent
    or unreadable. Negative or past values read as 0."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - now_epoch_s
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def rate_limit_wait(
    retry_after_s: float | None,
    *,
    default_s: float = DEFAULT_RATE_LIMIT_WAIT_S,
    max_s: float = DEFAULT_RATE_LIMIT_WAIT_MAX_S,
) -> float:
    """How long to wait on a 429: the server's Retry-After, else the default, capped."""
    wait = default_s if retry_after_s is None else retry_after_s
    return min(max(wait, 0.0), max_s)


def server_error_wait(backoff_s: float, retry_after_s: float | None, remaining_s: float) -> float:
    """How long to wait on a transient 5xx: Retry-After honoured but floored at the backoff
    (a proxy answering ``Retry-After: 0`` must not make every runner stampede it), and
    capped at what is left of the budget."""
    wait = backoff_s if retry_after_s is None else max(retry_after_s, backoff_s)
    return max(0.0, min(wait, remaining_s))


def network_wait(backoff_s: float, remaining_s: float, *, retries_so_far: int) -> float | None:
    """How long to wait after a retryable network failure, or None to give up.

    The budget is spent in full (the last wait is cut to what remains), and the guaranteed
    retry is granted even when nothing remains; that retry waits the plain backoff because
    retrying a refused connect at once proves nothing new.
    """
    if retries_so_far < GUARANTEED_NETWORK_RETRIES:
        return max(0.0, min(backoff_s, remaining_s)) if remaining_s > 0 else backoff_s
    if remaining_s <= 0:
        return None
    return min(backoff_s, remaining_s)
