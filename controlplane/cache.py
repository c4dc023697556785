"""Caches that cannot execute what they read.

Django's Redis and file caches unpickle every value they read, so whoever can write a
cache key (a neighbour on the same Redis, a process that can write ``var/cache``) runs
code in every worker and web process that reads it. Holdfast's cache holds JSON-safe
data only (worker snapshots, counters), so both are configured to store JSON instead
(``settings.CACHES``): a forged value is at worst a wrong value, never code.

``JsonSerializer`` plugs into Django's ``RedisCache`` (``OPTIONS["serializer"]``);
``JsonFileBasedCache`` is Django's file cache with the same format change. Values must
be JSON-safe: a tuple comes back as a list. An unreadable entry (an old pickled one, or
garbage) reads as a miss.
"""

from __future__ import annotations

import contextlib
import json
import time
import zlib

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.filebased import FileBasedCache
from django.core.files import locks


class JsonSerializer:
    """``RedisCache`` serializer: integers stay raw so ``incr``/``decr`` keep working in
    Redis, everything else is JSON."""

    def dumps(self, obj: object) -> int | bytes:
        if type(obj) is int:
            return obj
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> object:
        try:
            return int(data)
        except ValueError:
            pass
        try:
            return json.loads(data)
        except ValueError:
            return None  # not ours (an old pickle or a forgery): a miss, never code


class JsonFileBasedCache(FileBasedCache):
    """Django's file cache (the embedded default) storing a JSON expiry line and zlib'd
    JSON instead of pickles."""

    def get(self, key, default=None, version=None):
        fname = self._key_to_file(key, version)
        with contextlib.suppress(FileNotFoundError):
            with open(fname, "rb") as f:
                if not self._is_expired(f):
                    return _decode(f.read(), default)
        return default

    def _write_content(self, file, timeout, value):
        expiry = self.get_backend_timeout(timeout)
        file.write(json.dumps(expiry).encode() + b"\n")
        file.write(zlib.compress(json.dumps(value, separators=(",", ":")).encode()))

    def touch(self, key, timeout=DEFAULT_TIMEOUT, version=None):
        try:
            with open(self._key_to_file(key, version), "r+b") as f:
                try:
                    locks.lock(f, locks.LOCK_EX)
                    if self._is_expired(f):
                        return False
                    previous_value = _decode(f.read(), None)
                    f.seek(0)
                    f.truncate()
                    self._write_content(f, timeout, previous_value)
                    return True
                finally:
                    locks.unlock(f)
        except FileNotFoundError:
            return False

    def _is_expired(self, f):
        try:
            exp = json.loads(f.readline())
        except ValueError:
            exp = 0  # empty or not ours: expired
        if exp is not None and (not isinstance(exp, int | float) or exp < time.time()):
            f.close()
            self._delete(f.name)
            return True
        return False


def _decode(data: bytes, default: object) -> object:
    try:
        return json.loads(zlib.decompress(data))
    except (ValueError, zlib.error):
        return default
