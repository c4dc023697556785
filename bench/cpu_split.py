"""Where the CPU goes with 8 executions in flight on one host: the host process, its warm
template, the template's children (reaped, so counted in the template's children's
times), this client, and the whole machine, each per execution. Run as root:

    .venv/bin/python bench/cpu_split.py --seconds 8 [-- HOST ARGS, e.g. --reserve 0]

Read from /proc/<pid>/stat and /proc/stat before and after; the machine's share
includes other users of the machine and the kernel's workers.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import host_speed
from holdfast_devtools import processes

HZ = os.sysconf("SC_CLK_TCK")


def times(pid: int) -> tuple[float, float]:
    """(its own CPU seconds, its reaped children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ, (int(fields[13]) + int(fields[14])) / HZ


def machine() -> tuple[float, float]:
    """(busy CPU seconds, all CPU seconds) of the machine so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / HZ, sum(values) / HZ


def template_of(host_pid: int) -> int | None:
    for pid in processes.descendants(host_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if b"holdfast-template" in argv and ppid == host_pid:
            return pid
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("host_args", nargs="*")
    args = parser.parse_args()
    token = secrets.token_urlsafe(32)
    host = processes.start_host(token, host_id="cpu-split", extra_args=tuple(args.host_args))
    try:
        url = processes.host_url(host)
        time.sleep(1.5)  # the reserve fills
        template = template_of(host.pid)
        before = (times(host.pid), times(template) if template else (0.0, 0.0), machine(), os.times())
        rate = host_speed.throughput(lambda: host_speed.HostClient(url, token).execute, 8, args.seconds)
        after = (times(host.pid), times(template) if template else (0.0, 0.0), machine(), os.times())
    finally:
        host.stop()
    n = rate * args.seconds
    own = after[3].user + after[3].system - before[3].user - before[3].system

    def per(value: float) -> str:
        return f"{1000 * value / n:.2f}"

    print(f"8 in flight: {rate:.1f}/s; CPU ms per execution:")
    print(f"  host                       {per(after[0][0] - before[0][0])}")
    print(f"  template                   {per(after[1][0] - before[1][0])}")
    print(f"  template's children        {per(after[1][1] - before[1][1])}")
    print(f"  this client                {per(own)}")
    print(f"  whole machine, busy        {per(after[2][0] - before[2][0])} of {per(after[2][1] - before[2][1])}")


if __name__ == "__main__":
    main()
