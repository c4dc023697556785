"""What submitting costs the caller's process alone: ``actions.create`` (the owner's
lock, its counts, the INSERT) for a trivial snippet, 100 calls with a short pause
between them, as a service submits now and then. To price a change to create or to
admission, run it again in a worktree of the older revision. One command:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    .venv/bin/python bench/create_cost.py [--n 100] [--pause-s 0.005]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run  # sets Django up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--pause-s", type=float, default=0.005)
    args = parser.parse_args()
    from controlplane.executions import actions
    from controlplane.executions.models import Execution, Status

    run.prepare_database()
    samples = []
    try:
        for _ in range(args.n + 5):  # the first five warm the connection and the caches
            started = time.perf_counter()
            actions.create("print(1)", owner="bench", timeout_s=10, memory_mb=None)
            samples.append(time.perf_counter() - started)
            time.sleep(args.pause_s)
    finally:
        # Nothing is to run them: cancelled, they count toward no cap.
        Execution.objects.filter(owner="bench", status=Status.QUEUED).update(status=Status.CANCELLED)
    p50, p95 = run.ms(samples[5:])
    print(f"actions.create, {args.n} calls {args.pause_s * 1000:g} ms apart: p50 {p50:.2f} ms, p95 {p95:.2f} ms")


if __name__ == "__main__":
    main()
