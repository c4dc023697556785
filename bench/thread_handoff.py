"""What starting an execution's thread costs the host, against handing the execution to
a thread already waiting (``sandbox_host/workers.py``): from the call to the job running,
one at a time, in this process. One command:

    .venv/bin/python bench/thread_handoff.py [--n 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_host.workers import Workers


def start_thread(job) -> None:
    threading.Thread(target=job, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    workers = Workers(keep=4, idle_s=60)
    ways = {
        "a new thread (Thread.start)": start_thread,
        "a waiting thread (Workers.run)": lambda job: workers.run(job, "bench"),
    }
    print(f"{'call to the job running':<34} {'apart':>8} {'p50 ms':>8}")
    for pause in (0.1, 0.005):
        for label, start in ways.items():
            took = []
            for _ in range(args.n):
                ran = threading.Event()
                at = [0.0]

                def job(ran=ran, at=at) -> None:
                    at[0] = time.perf_counter()
                    ran.set()

                called = time.perf_counter()
                start(job)
                ran.wait()
                took.append((at[0] - called) * 1000)
                time.sleep(pause)
            print(f"{label:<34} {pause * 1000:>6g}ms {statistics.median(took):>8.3f}")


if __name__ == "__main__":
    main()
