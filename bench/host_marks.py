"""Where P1's host side goes, step by step: one trivial execution at a time on a real
host with the warm template and its reserve, the host's steps timestamped by
``bench/host_marks_inject.py`` (loaded into that host only) and the client's own
beside them, on the one monotonic clock of the machine. One command:

    .venv/bin/python bench/host_marks.py [--n 100] [--pause-s 0.1]

Each step's p50 is the time since the step before it, so the column adds up to about
the round trip. The marks cost a little themselves (a line written per step).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from bench.host_speed import SNIPPET, HostClient  # noqa: E402
from holdfast_devtools import processes  # noqa: E402

# The order an execution goes through them; the client's marks are made here.
CHAIN = (
    "client sends",
    "socket readable",
    "websocket frame read",
    "frame decoded",
    "execute requested",
    "admitted",
    "execution thread running",
    "deliver begins",
    "priority restored",
    "code delivered",
    "started send begins",
    "started sent",
    "outcome read",
    "result send begins",
    "result sent",
    "client has the result",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--pause-s", type=float, default=0.1, help="between executions")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="holdfast-host-marks-"))
    (work / "sitecustomize.py").write_text("import bench.host_marks_inject  # noqa: F401\n")
    marks_path = work / "marks"
    marks_path.touch()
    env = {
        "PYTHONPATH": os.pathsep.join([str(work), str(ROOT)]),
        "HOLDFAST_BENCH_HOST_MARKS": str(marks_path),
    }
    token = secrets.token_urlsafe(32)
    host = processes.start_host(token, host_id="marks", env=env)
    client_marks: list[tuple[float, str]] = []
    client = None
    try:
        client = HostClient(processes.host_url(host), token)
        time.sleep(1.0)  # the reserve fills
        for i in range(args.n + 5):  # the first five warm the path
            # From its frame's first byte written to the result's last byte read (P1's
            # host side): the client's framing and decoding are outside both marks.
            sent, received = client.exchange(SNIPPET, clock=time.monotonic)
            if i >= 5:
                client_marks += [(sent, "client sends"), (received, "client has the result")]
            time.sleep(args.pause_s)
    finally:
        if client is not None:
            client.close()
        host.stop()
    host_marks = [(float(t), what) for t, what in (line.split(" ", 1) for line in marks_path.read_text().splitlines())]
    shutil.rmtree(work)
    report(client_marks, host_marks, args)


def report(client_marks: list[tuple[float, str]], host_marks: list[tuple[float, str]], args) -> None:
    steps: dict[str, list[float]] = {what: [] for what in CHAIN[1:]}
    totals = []
    starts = [t for t, _ in client_marks[::2]]
    for i, ((start, _), (end, _)) in enumerate(zip(client_marks[::2], client_marks[1::2], strict=True)):
        at = {"client sends": start, "client has the result": end}
        # Up to the next execution, not to the client's mark: a host step that ends
        # after the client has the result (the end of its send) still counts here, and
        # the client's row then shows it as negative instead of hiding it.
        until = starts[i + 1] if i + 1 < len(starts) else float("inf")
        for t, what in host_marks:
            if start <= t < until:
                at.setdefault(what, t)
        previous = start
        for what in CHAIN[1:]:
            if what in at:
                steps[what].append((at[what] - previous) * 1000)
                previous = at[what]
        totals.append((end - start) * 1000)
    print(f"host side step by step, n={args.n}, {args.pause_s * 1000:g} ms apart")
    print(f"{'step (ms since the step before)':<34} {'p50':>7} {'p90':>7}")
    for what, values in steps.items():
        if values:
            values.sort()
            print(f"{what:<34} {statistics.median(values):>7.3f} {values[int(len(values) * 0.9)]:>7.3f}")
    totals.sort()
    print(f"{'round trip':<34} {statistics.median(totals):>7.3f} {totals[int(len(totals) * 0.9)]:>7.3f}")


if __name__ == "__main__":
    main()
