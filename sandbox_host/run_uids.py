"""Unprivileged uids for run sandboxes (root hosts only), one per live run, machine-wide.

A run outlives the host process that launched it, so the uid it runs under cannot come
from the host's execution block (``uids.claim``): that block is freed when the host
exits and a restarted host could hand the same uid to an execution, whose end sweeps
every process of its uid. Runs therefore take uids from their own range, and a uid is
claimed in a registry every host on the machine shares: ``<dir>/<uid>.json`` names the
process (pid and kernel start time) that holds it. A claim whose process is gone is
free again. Claims are made under one ``flock`` so two hosts never pick the same uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
from collections.abc import Iterator

from . import defaults
from .procs import alive

# ``{uid}.json`` with pid -1: claimed, the process is being started (under the lock).
_STARTING = -1


def _registry_dir() -> str:
    base = "/run" if os.path.isdir("/run") else "/tmp"  # noqa: S108 - root-owned dir made below
    path = os.path.join(base, "holdfast-run-uids")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


@contextlib.contextmanager
def registry() -> Iterator[Registry]:
    """Hold the machine-wide lock while a uid is chosen and its process started."""
    directory = _registry_dir()
    fd = os.open(os.path.join(directory, "lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Registry(directory)
    finally:
        os.close(fd)  # closing drops the flock


class Registry:
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _path(self, uid: int) -> str:
        return os.path.join(self.directory, f"{uid}.json")

    def _held(self, uid: int) -> bool:
        try:
            with open(self._path(uid)) as fh:
                claim = json.load(fh)
        except (OSError, ValueError):
            return False
        return alive(claim.get("pid", 0), claim.get("start_time"))

    def claim(self) -> int:
        """A uid no live run holds (claimed as starting); raises RuntimeError when the
        range is full."""
        known = {entry.pw_uid for entry in pwd.getpwall()}
        first = defaults.DEFAULT_RUN_UID_BASE
        for uid in range(first, first + defaults.DEFAULT_RUN_UIDS):
            if uid in known or self._held(uid):
                continue
            self.record(uid, _STARTING, None)
            return uid
        raise RuntimeError("no free uid for a run sandbox")

    def record(self, uid: int, pid: int, start_time: int | None) -> None:
        with open(self._path(uid), "w") as fh:
            json.dump({"pid": pid, "start_time": start_time}, fh)

    def release_if_held_by(self, uid: int, pid: object, start_time: object) -> bool:
        """Drop the claim on ``uid`` if it names this process; True if it did."""
        try:
            with open(self._path(uid)) as fh:
                claim = json.load(fh)
        except (OSError, ValueError):
            return False
        if claim.get("pid") != pid or claim.get("start_time") != start_time:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(uid))
        return True
