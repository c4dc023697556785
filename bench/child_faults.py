"""What preparing one sandbox costs the machine, from the warm template: the CPU time and
the minor page faults a prepared child took by the time it waits for code (most faults
are copy-on-write copies of the template's pages, touched by the interpreter running
the set-up), and what its one execution adds; then, for the last child while it
waited, its own copies of the template's pages by mapping (``Private_Dirty`` in its
``/proc/<pid>/smaps``). Run as root on a host with bubblewrap:

    .venv/bin/python bench/child_faults.py --n 20

Uses uids from 300000 up, which no host of this machine hands out by default."""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_host import isolation
from sandbox_host.children import Child, Limits
from sandbox_host.template_host import Template

UID_BASE = 300_000
# Long enough to read the child's counters while it still runs.
SNIPPET = "print(1)\nimport time\ntime.sleep(0.2)"


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def cpu_ms(pid: int) -> float:
    """Time the process has spent on a CPU, from the scheduler's own count (ns)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6


def own_copies(pid: int) -> dict[str, int]:
    """KiB of pages only ``pid`` holds (written since its fork), by mapping: anonymous
    (the interpreter's arenas), the malloc heap, a file's private mapping by name."""
    found: dict[str, int] = {}
    mapping = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields[0].endswith(":"):
            if fields[0] == "Private_Dirty:":
                found[mapping] = found.get(mapping, 0) + int(fields[1])
        else:  # a mapping's header: range, perms, offset, device, inode[, path]
            mapping = os.path.basename(fields[5]) if len(fields) > 5 else "anonymous (the interpreter's arenas)"
    return {name: kib for name, kib in sorted(found.items(), key=lambda item: -item[1]) if kib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    sandbox = isolation.build("bwrap", uid_base=UID_BASE)
    template = Template(sandbox)
    template.start()
    sandbox = dataclasses.replace(sandbox, template=template)
    prepared, ran, prepared_cpu, ran_cpu = [], [], [], []
    copies: dict[str, int] = {}
    for i in range(args.n):
        child = Child(None, Limits(timeout_ms=60_000, memory_mb=512), isolation=sandbox, uid=sandbox.uid_for(i % 4))
        child.start()
        time.sleep(0.3)  # waiting for its code
        pid = child.proc.pid
        prepared.append(minor_faults(pid))
        prepared_cpu.append(cpu_ms(pid))
        copies = own_copies(pid)
        child.deliver(SNIPPET, Limits(timeout_ms=10_000, memory_mb=256))
        time.sleep(0.1)
        ran.append(minor_faults(pid) - prepared[-1])
        ran_cpu.append(cpu_ms(pid) - prepared_cpu[-1])
        outcome = child.wait()
        child.cleanup()
        if outcome.status != "succeeded":
            raise SystemExit(f"child_faults: unexpected outcome {outcome}")
    print(f"{'one template child':<40} {'faults p50':>10} {'min':>6} {'CPU ms p50':>10} {'min':>6}")
    for what, faults, cpu in (
        ("prepared (forked, contained, waiting)", prepared, prepared_cpu),
        ("its execution of print(1)", ran, ran_cpu),
    ):
        print(
            f"{what:<40} {statistics.median(faults):>10.0f} {min(faults):>6} "
            f"{statistics.median(cpu):>10.2f} {min(cpu):>6.2f}"
        )
    print(f"\nthe last child's own copies while it waited: {sum(copies.values())} KiB")
    for name, kib in copies.items():
        print(f"  {name:<50} {kib:>6} KiB")


if __name__ == "__main__":
    main()
