"""Fixed-window rate limits kept in Django's cache (Redis in production, so every web
process counts together).

``hit(scope, ident, limit, window_s)`` counts one request for ``ident`` (a run key's
digest, a client address) and returns ``None`` while within ``limit`` requests per
``window_s``, else the seconds until the window ends: the ``Retry-After`` a 429 carries.
A fixed window lets a client burst up to twice the limit across a boundary; that is fine
for what these limits are for (stopping floods and password guessing, not metering).
"""

from __future__ import annotations

import hashlib
import math
import time

from django.core.cache import cache

# The clock windows are counted on (tests pin it: a burst that straddles a window
# boundary is counted in two windows, which a test of the limit must not depend on).
clock = time.time


def hit(scope: str, ident: str, *, limit: int, window_s: float, now: float | None = None) -> int | None:
    now = clock() if now is None else now
    window = int(now // window_s)
    # Hashed: an identifier may be a bearer token or carry characters a cache key cannot.
    digest = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    key = f"holdfast:rl:{scope}:{digest}:{window}"
    # add() then incr(): atomic on Redis, so concurrent requests never under-count.
    cache.add(key, 0, timeout=math.ceil(window_s) + 1)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr: this request opens the window
        cache.set(key, 1, timeout=math.ceil(window_s) + 1)
        count = 1
    if count <= limit:
        return None
    return max(1, math.ceil((window + 1) * window_s - now))


def client_address(request) -> str:
    """The peer address Django saw. Behind a balancer this is the balancer unless it
    passes the client on at the TCP level (PROXY protocol) or the web server rewrites
    REMOTE_ADDR; X-Forwarded-For is not trusted here because any client can send it."""
    return request.META.get("REMOTE_ADDR", "") or "unknown"
