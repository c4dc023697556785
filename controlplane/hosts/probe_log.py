"""What reconcile's probes heard from each host, for the drain page and ``drain_host``.

Reconcile (controlplane/runs/reconcile.py) probes every host that holds live runs once
per tick. A host that does not answer leaves its runs untouched, so its silence must be
visible somewhere else: here. One cache key holds every host's entry::

    {"h1": {"last_answer_at": <epoch s> | None, "last_probed_at": <epoch s>,
            "silent_since": <epoch s> | None, "silent_ticks": 0}}

Overlapping ticks may interleave their read-modify-write of the key; the worst case is
one tick's observation lost, which the next tick repeats. Nothing decides on it.
"""

from __future__ import annotations

from datetime import datetime

from django.core.cache import cache

KEY = "holdfast:hosts:probes"
# Kept a day: a host that held runs and went silent stays visible long after.
TTL_S = 24 * 3600


def record(*, answered: list[str], silent: list[str], at: datetime) -> None:
    if not answered and not silent:
        return
    when = at.timestamp()
    # Hosts not probed for a day (retired, renamed) drop out, so the key stays small.
    entries = {
        host: entry
        for host, entry in (cache.get(KEY) or {}).items()
        if max(entry.get("last_answer_at") or 0, entry.get("last_probed_at") or 0) > when - TTL_S
    }
    for host in answered:
        entries[host] = {"last_answer_at": when, "last_probed_at": when, "silent_since": None, "silent_ticks": 0}
    for host in silent:
        previous = entries.get(host) or {"last_answer_at": None, "silent_since": None, "silent_ticks": 0}
        entries[host] = {
            "last_answer_at": previous.get("last_answer_at"),
            "silent_since": previous.get("silent_since") or when,
            "silent_ticks": int(previous.get("silent_ticks") or 0) + 1,
            "last_probed_at": when,
        }
    cache.set(KEY, entries, TTL_S)


def entries() -> dict[str, dict]:
    return dict(cache.get(KEY) or {})
