"""What memory costs this machine per page, and what a fork of the warm template costs
against a fork of a bare interpreter: the floor under every prepared sandbox (the
template forks it, it copies the pages it writes, its exit unmaps them all). Each row
runs in a new interpreter (``-I -S``); a fork is timed from ``fork()`` to its child's
exit reaped, the child exiting at once or after reading every warm module's attributes
as a sandbox's set-up reads its modules (each read writes a reference count, so copies
the page). ``--per-module`` adds what each warm module alone adds to a bare
interpreter's anonymous memory, and all of them together. One command:

    .venv/bin/python bench/fork_cost.py [--n 60] [--per-module]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_host.template import WARM  # noqa: E402

PAGES = """
import ctypes, json, mmap, time
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_POPULATE_WRITE = 23
SIZE = 64 << 20
PAGES = SIZE // 4096
found = {"touch": [], "populate": [], "copy": []}
for _ in range(3):
    area = mmap.mmap(-1, SIZE)
    started = time.perf_counter()
    for offset in range(0, SIZE, 4096):
        area[offset] = 1
    found["touch"].append(time.perf_counter() - started)
    area.close()
    area = mmap.mmap(-1, SIZE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    started = time.perf_counter()
    if libc.madvise(address, SIZE, MADV_POPULATE_WRITE) != 0:
        raise OSError(ctypes.get_errno(), "madvise")
    found["populate"].append(time.perf_counter() - started)
    source, target = bytearray(b"x" * SIZE), bytearray(b"y" * SIZE)
    started = time.perf_counter()
    target[:] = source
    found["copy"].append(time.perf_counter() - started)
print(json.dumps({k: sorted(v)[1] / PAGES * 1e6 for k, v in found.items()}))
"""

FORKS = """
import gc, os, sys, time  # json only at the end: it would bring re into the bare row
for name in sys.argv[1].split(",") if sys.argv[1] else ():
    __import__(name)
read_modules = sys.argv[2] == "read"
n = int(sys.argv[3])
gc.collect()
gc.freeze()
modules = [m for m in sys.modules.values() if hasattr(m, "__dict__")]
def status():
    with open("/proc/self/status") as fh:
        return {line.split(":")[0]: int(line.split()[1]) for line in fh if line.startswith(("RssAnon", "VmPTE"))}
times = []
for _ in range(n):
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        if read_modules:
            for module in modules:
                for value in list(vars(module).values()):
                    pass
        os._exit(0)
    os.waitpid(pid, 0)
    times.append(time.perf_counter() - started)
    time.sleep(0.01)
times.sort()
memory = status()
import json
print(json.dumps({"p50": times[n // 2] * 1000, "p90": times[int(n * 0.9)] * 1000, **memory}))
"""


ANON = """
import gc, sys  # only what a bare interpreter has loaded already: json would bring re
def anon():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("RssAnon"))
gc.collect()
before = anon()
for name in sys.argv[1].split(","):
    __import__(name)
gc.collect()
print('{"kib": %d}' % (anon() - before))
"""


def probe(source: str, *args: str) -> dict:
    found = subprocess.run(
        [sys.executable, "-I", "-S", "-c", source, *args], capture_output=True, text=True, check=True, timeout=300
    )
    return json.loads(found.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60, help="forks per row")
    parser.add_argument("--per-module", action="store_true", help="each warm module's anonymous memory")
    args = parser.parse_args()
    pages = probe(PAGES)
    print(f"{'what':<72} {'us/page':>8}")
    print(f"{'memcpy into memory already faulted in (baseline)':<72} {pages['copy']:>8.2f}")
    print(f"{'first write to fresh anonymous memory, one fault per page':<72} {pages['touch']:>8.2f}")
    print(f"{'the same, faulted in by the kernel in one call (MADV_POPULATE_WRITE)':<72} {pages['populate']:>8.2f}")
    print()
    warm = ",".join(WARM)
    rows = [
        ("bare interpreter, the child exits at once (baseline)", "", "exit"),
        ("the warm template's modules imported, the child exits at once", warm, "exit"),
        ("the same, the child reads every module's attributes first", warm, "read"),
    ]
    print(f"{'fork, child exit, reaped':<64} {'p50 ms':>7} {'p90 ms':>7} {'RssAnon':>9} {'VmPTE':>6}")
    for label, modules, mode in rows:
        found = probe(FORKS, modules, mode, str(args.n))
        print(
            f"{label:<64} {found['p50']:>7.2f} {found['p90']:>7.2f} "
            f"{found['RssAnon'] / 1024:>7.1f}Mi {found['VmPTE']:>4}Ki"
        )
    if args.per_module:
        added = sorted(((probe(ANON, name)["kib"], name) for name in WARM), reverse=True)
        print(f"\n{'anonymous memory a warm module adds to a bare interpreter':<64} {'KiB':>7}")
        for kib, name in added:
            print(f"{name:<64} {kib:>7}")
        print(f"{'all of them together':<64} {probe(ANON, warm)['kib']:>7}")


if __name__ == "__main__":
    main()
