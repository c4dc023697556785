"""Whether work on one core slows work on the other through something they share on
these machines: the hypervisor's handling of page tables (every fork and page fault
traps to it here, `nested_pvm=1`), or the cache. Each of three loops runs pinned to
core 0, alone and beside each loop pinned to core 1: pure arithmetic, page faults
(16 MiB of private memory mapped, touched a page at a time, unmapped), and forks of a
process holding 32 MiB (a template's fork is one). A loop slowed beside the faulting
or forking one, and not beside the arithmetic, would point to something they share
(the hypervisor or the cache; this does not tell which), which no priority of the
refill could avoid (docs/benchmarks.md, twelfth session). Linux with two cores or more.
One command:

    .venv/bin/python bench/beside.py [--seconds 2] [--rounds 3]

This machine's rates drift by a quarter from minute to minute, so each cell is the
median over rounds of a loop's rate beside another against its rate alone measured
just before it.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import statistics
import time

PAGE = mmap.PAGESIZE
LOOPS = ("arithmetic", "page faults", "forks")
UNITS = {"arithmetic": "k loops/s", "page faults": "k faults/s", "forks": "forks/s"}


def arithmetic(deadline: float) -> float:
    count, x = 0, 1
    while time.monotonic() < deadline:
        for _ in range(1000):
            x = (x * 6364136223846793005 + 1) & 0xFFFFFFFFFFFFFFFF
        count += 1
    return count


def page_faults(deadline: float) -> float:
    count, size = 0, 16 << 20
    while time.monotonic() < deadline:
        area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for offset in range(0, size, PAGE):
            area[offset] = 1
        area.close()
        count += size // PAGE
    return count / 1000


def forks(deadline: float) -> float:
    count = 0
    while time.monotonic() < deadline:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        count += 1
    return count


def rate(loop: str, core: int, seconds: float, start_at: float, out) -> None:
    os.sched_setaffinity(0, {core})
    body = {"arithmetic": arithmetic, "page faults": page_faults, "forks": forks}[loop]
    # Touched before the clock starts, so each fork copies its page tables (the pages
    # themselves are shared until written).
    held = bytearray(b"\1" * (32 << 20)) if loop == "forks" else None
    while time.monotonic() < start_at:
        time.sleep(0.001)
    out.put(body(start_at + seconds) / seconds)
    del held


def measure(loop: str, beside: str | None, seconds: float) -> float:
    """``loop``'s rate on core 0, with ``beside`` running on core 1 the whole time."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    start_at = time.monotonic() + 0.3
    procs = [ctx.Process(target=rate, args=(loop, 0, seconds, start_at, results))]
    if beside is not None:
        # Starts before and ends after the measured loop, so it is beside it throughout.
        procs.append(ctx.Process(target=rate, args=(beside, 1, seconds + 0.4, start_at - 0.2, ctx.Queue())))
    for p in procs:
        p.start()
    try:
        value = results.get(timeout=seconds + 30)
        for p in procs:
            p.join(timeout=seconds + 30)
    finally:
        for p in procs:
            p.kill()  # one that hangs must not run beside the next measurement
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("beside: needs two cores")
    print(f"{'on core 0':<14}{'unit':<13}{'alone (p50)':>12}" + "".join(f"{'beside ' + b:>20}" for b in LOOPS))
    for loop in LOOPS:
        alone, ratios = [], {b: [] for b in LOOPS}
        for _ in range(args.rounds):
            for b in LOOPS:
                alone.append(measure(loop, None, args.seconds))
                ratios[b].append(measure(loop, b, args.seconds) / alone[-1])
        row = "".join(f"{statistics.median(ratios[b]):>19.2f}x" for b in LOOPS)
        print(f"{loop:<14}{UNITS[loop]:<13}{statistics.median(alone):>12.1f}{row}")


if __name__ == "__main__":
    main()
