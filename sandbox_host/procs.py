"""Process identity from /proc: a pid alone is reused by the kernel, a pid with its start
time (field 22 of /proc/<pid>/stat, in clock ticks since boot) names one process for good.
Run records keep both, so a restarted host can tell its run from a stranger."""

from __future__ import annotations


def _stat_fields(pid: int) -> list[str] | None:
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    # Fields after the parenthesised command name (which may hold spaces): state is
    # field 3, start time field 22, so they are [0] and [19] of what follows ")".
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, expected_start: int | None) -> bool:
    """True if ``pid`` is running (not a zombie) and is the process that started at
    ``expected_start``."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return expected_start is None or int(fields[19]) == expected_start
