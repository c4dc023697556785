"""The control plane's caches never execute what they read (controlplane/cache.py): a
pickle planted under a key a worker reads (the drain page's snapshot keys) is a miss,
not code running as root in every worker and the web process."""

from __future__ import annotations

import os
import pickle
import zlib

import pytest
from django.core.cache import cache

from controlplane.cache import JsonFileBasedCache
from controlplane.hosts import snapshots


class Planted:
    """Unpickling this runs ``os.system``: what a hostile neighbour on Redis would write."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_pickle_planted_in_redis_is_a_miss_and_runs_nothing(tmp_path):
    import redis
    from django.conf import settings

    proof = tmp_path / "pwned"
    key = cache.make_key(snapshots.INDEX_KEY)
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    client.set(key, pickle.dumps(Planted(str(proof))))
    try:
        assert snapshots.live_snapshots() == []  # reads INDEX_KEY
        assert cache.get(snapshots.INDEX_KEY) is None
    finally:
        client.delete(key)
    assert not proof.exists()


def test_values_round_trip_as_json_and_counters_stay_counters():
    snapshot = {"worker": "w pid=1", "hosts": {"h1": {"connections": 2, "isolation": "bwrap"}}}
    cache.set("holdfast:test:snap", snapshot, 30)
    assert cache.get("holdfast:test:snap") == snapshot
    cache.set("holdfast:test:n", 1, 30)
    assert cache.incr("holdfast:test:n") == 2 and cache.get("holdfast:test:n") == 2
    cache.delete_many(["holdfast:test:snap", "holdfast:test:n"])


@pytest.fixture
def file_cache(tmp_path):
    return JsonFileBasedCache(str(tmp_path / "cache"), {})


def test_the_file_cache_round_trips_and_expires(file_cache):
    file_cache.set("k", {"a": [1, 2]}, 30)
    assert file_cache.get("k") == {"a": [1, 2]}
    assert file_cache.touch("k", 60) and file_cache.get("k") == {"a": [1, 2]}
    file_cache.set("gone", 1, -1)
    assert file_cache.get("gone", "miss") == "miss"


def test_a_pickle_planted_in_the_file_cache_is_a_miss_and_runs_nothing(file_cache, tmp_path):
    proof = tmp_path / "pwned"
    file_cache.set("k", "honest", 30)
    path = file_cache._key_to_file("k")
    with open(path, "wb") as fh:  # Django's own format: pickled expiry, then zlib'd pickle
        fh.write(pickle.dumps(None))
        fh.write(zlib.compress(pickle.dumps(Planted(str(proof)))))
    assert file_cache.get("k", "miss") == "miss"
    assert not proof.exists()
