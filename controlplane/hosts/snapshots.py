"""Worker pool snapshots in Django's cache: the only channel from workers to the page.

Each worker process writes its own key with a time-to-live of a few publish intervals,
so a worker that dies disappears from the page instead of lying about connections it no
longer holds. An index key lists the live worker keys (Django's cache API cannot list
keys); readers drop index entries whose key has expired.

A snapshot (JSON-safe dict)::

    {"worker": "hostname pid=123", "published_at": <epoch s>, "max_age_s": 120.0,
     "draining_applied": ["h1"],          # operator drains this pool has applied
     "hosts": {"h1": {"connections": 2, "retiring": 1, "oldest_age_s": 80.2,
                      "youngest_open_age_s": 3.1, "in_flight": 3, "finished_recent": 40,
                      "retire_reasons": ["max age"], "urls": ["ws://..."],
                      "isolation": "bwrap"}}}
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable

from django.conf import settings
from django.core.cache import cache

from controlplane.pool.state import ConnectionSnapshot, ConnState

KEY_PREFIX = "holdfast:hosts:worker:"
INDEX_KEY = "holdfast:hosts:workers"
LIVE_STATES = (ConnState.OPEN, ConnState.RETIRING)


def worker_key(worker: str) -> str:
    # Portable cache keys (memcached's rules): no spaces or control characters.
    return KEY_PREFIX + re.sub(r"[^A-Za-z0-9_.:@-]", "_", worker)[:200]


def empty_host() -> dict:
    """One host's figures before any connection is counted."""
    return {
        "connections": 0,
        "retiring": 0,
        "oldest_age_s": 0.0,
        "youngest_open_age_s": None,
        "in_flight": 0,
        "finished_recent": 0,
        "retire_reasons": [],
        "urls": [],
        "isolation": "",
        "reserve": None,
    }


def summarize(connections: Iterable[ConnectionSnapshot], finished_recent: dict[str, int]) -> dict[str, dict]:
    """Fold ``SandboxPool.snapshot()`` rows into per-host figures (JSON-safe)."""
    hosts: dict[str, dict] = {}

    for conn in connections:
        if not conn.host_id:
            continue
        item = hosts.setdefault(conn.host_id, empty_host())
        item["isolation"] = conn.isolation or item["isolation"]
        if conn.reserve is not None:
            item["reserve"] = conn.reserve
        reason = str(conn.retire_reason or "")
        if reason and reason not in item["retire_reasons"]:
            # Kept even for closed connections: an idle connection that got the host's
            # draining frame closes at once, and this is how the drain is still seen.
            item["retire_reasons"].append(reason)
        if conn.state not in LIVE_STATES:
            continue
        item["connections"] += 1
        item["in_flight"] += conn.in_flight
        age = float(conn.age_s)
        item["oldest_age_s"] = max(item["oldest_age_s"], round(age, 1))
        if conn.state is ConnState.RETIRING:
            item["retiring"] += 1
        elif item["youngest_open_age_s"] is None or age < item["youngest_open_age_s"]:
            item["youngest_open_age_s"] = round(age, 1)
        if conn.url and conn.url not in item["urls"]:
            item["urls"].append(conn.url)
    for host_id, count in finished_recent.items():
        if host_id:
            hosts.setdefault(host_id, empty_host())["finished_recent"] = count
    return hosts


def publish(snapshot: dict, *, interval_s: float | None = None) -> None:
    """Write one worker's snapshot and refresh its place in the index."""
    interval = interval_s or settings.HOSTS_SNAPSHOT_INTERVAL_S
    # Whole seconds, at least one: Redis expires by the second and a 0 would mean "now".
    ttl = max(1, math.ceil(interval * settings.HOSTS_SNAPSHOT_TTL_INTERVALS))
    key = worker_key(snapshot["worker"])
    cache.set(key, snapshot, timeout=ttl)
    now = time.time()
    # Read-modify-write: two workers writing at the same instant can drop each other's
    # entry for one interval; the next publish puts it back. Expired entries go here.
    index = {k: exp for k, exp in (cache.get(INDEX_KEY) or {}).items() if exp > now}
    index[key] = now + ttl
    cache.set(INDEX_KEY, index, timeout=ttl * 10)


def withdraw(worker: str) -> None:
    """A worker shutting down removes itself at once rather than waiting for the TTL."""
    key = worker_key(worker)
    cache.delete(key)
    index = cache.get(INDEX_KEY) or {}
    if index.pop(key, None) is not None:
        cache.set(INDEX_KEY, index, timeout=settings.HOSTS_SNAPSHOT_INTERVAL_S * 30)


def live_snapshots() -> list[dict]:
    """Every live worker's latest snapshot, oldest worker label first."""
    index = cache.get(INDEX_KEY) or {}
    now = time.time()
    keys = [k for k, exp in index.items() if exp > now]
    found = cache.get_many(keys) if keys else {}
    return sorted(found.values(), key=lambda s: s.get("worker", ""))
