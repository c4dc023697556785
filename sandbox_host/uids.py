"""Claim a block of unprivileged uids for this host's execution slots (root hosts only).

Slot N runs as ``base + N``, so RLIMIT_NPROC is per execution and the host may SIGKILL
every process of a slot's uid when its execution ends. That is only safe if no other
host on the machine uses the same uids: each host takes an exclusive ``flock`` on one
lock file per block and keeps it for its lifetime (the kernel drops it when the process
dies, so a killed host frees its block). Blocks that overlap a uid from the passwd
database are skipped: those belong to real users.

Errors::

    UidRangeError        no free block (raised as RuntimeError's subclass)
"""

from __future__ import annotations

import fcntl
import os
import pwd

from . import defaults


class UidRangeError(RuntimeError):
    pass


def _lock_dir() -> str:
    base = "/run" if os.path.isdir("/run") else "/tmp"  # noqa: S108 - root-owned dir made below
    path = os.path.join(base, "holdfast-host-uids")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _has_passwd_entry(first: int, count: int) -> bool:
    known = {entry.pw_uid for entry in pwd.getpwall()}
    return any(uid in known for uid in range(first, first + count))


def block_of(uid: int) -> int | None:
    """The base of the execution block ``uid`` belongs to, or None if it is in none."""
    first, size = defaults.DEFAULT_CHILD_UID_BASE, defaults.DEFAULT_UID_BLOCK_SIZE
    if not first <= uid < first + size * defaults.DEFAULT_UID_BLOCKS:
        return None
    return first + (uid - first) // size * size


def block_is_free(base: int) -> bool:
    """True if no live host holds block ``base`` (its lock is free): whatever its uids
    left behind belongs to a host that is gone. Never true for the caller's own block
    (a second flock of the same file conflicts with the first)."""
    try:
        fd = os.open(os.path.join(_lock_dir(), f"{base}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # drops the lock if we took it
    return True


def claim(count: int) -> tuple[int, int]:
    """Return ``(base, fd)``: uids ``base .. base + count - 1`` are ours while ``fd``
    stays open."""
    size = defaults.DEFAULT_UID_BLOCK_SIZE
    if count > size:
        raise UidRangeError(f"at most {size} execution slots per host")
    directory = _lock_dir()
    for block in range(defaults.DEFAULT_UID_BLOCKS):
        base = defaults.DEFAULT_CHILD_UID_BASE + block * size
        if _has_passwd_entry(base, count):
            continue
        fd = os.open(os.path.join(directory, f"{base}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return base, fd
    raise UidRangeError(f"no free block of {count} uids for execution slots")
