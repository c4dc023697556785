"""Where a prepared sandbox's time goes, host side and without the WebSocket: a child
prepared ahead (bubblewrap, setpriv, the waiting interpreter; or with ``--template``,
forked by the warm template), then ``deliver`` its code, ``wait`` for its outcome,
``cleanup``; and a child started with its code (``start to outcome``: what an
execution that finds the reserve empty waits). Run as root on a host with bubblewrap:

    .venv/bin/python bench/child_phases.py --n 20 [--template]

Uses uids from 300000 up, which no host of this machine hands out by default."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dataclasses

from sandbox_host import isolation
from sandbox_host.children import Child, Limits
from sandbox_host.template_host import Template

UID_BASE = 300_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--template", action="store_true", help="children from the warm template")
    args = parser.parse_args()
    sandbox = isolation.build("bwrap", uid_base=UID_BASE)
    if args.template:
        template = Template(sandbox)
        template.start()
        sandbox = dataclasses.replace(sandbox, template=template)
    phases: dict[str, list[float]] = {"deliver": [], "wait": [], "deliver to outcome": [], "cleanup": []}
    phases["start to outcome"] = []
    for i in range(args.n):
        child = Child(None, Limits(timeout_ms=60_000, memory_mb=512), isolation=sandbox, uid=sandbox.uid_for(i % 4))
        child.start()
        time.sleep(0.3)  # prepared ahead: its interpreter is waiting on the pipe
        t0 = time.perf_counter()
        child.deliver("print(1)", Limits(timeout_ms=10_000, memory_mb=256))
        t1 = time.perf_counter()
        outcome = child.wait()
        t2 = time.perf_counter()
        child.cleanup()
        t3 = time.perf_counter()
        if outcome.status != "succeeded" or outcome.stdout != "1\n":
            raise SystemExit(f"child_phases: unexpected outcome {outcome}")
        fresh = Child("print(1)", Limits(timeout_ms=10_000, memory_mb=256), isolation=sandbox, uid=sandbox.uid_for(5))
        t4 = time.perf_counter()
        fresh.start()
        fresh.wait()
        t5 = time.perf_counter()
        fresh.cleanup()
        for name, value in zip(phases, (t1 - t0, t2 - t1, t2 - t0, t3 - t2, t5 - t4), strict=True):
            phases[name].append(value * 1000)
    print(f"{'phase':<20} {'p50 ms':>8} {'min ms':>8}")
    for name, values in phases.items():
        print(f"{name:<20} {statistics.median(values):>8.2f} {min(values):>8.2f}")


if __name__ == "__main__":
    main()
