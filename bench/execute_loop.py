"""``execute()`` of a trivial snippet back to back for ``--seconds``, on a real host and
a real Celery worker, and nothing else: a steady load to profile the whole machine
under, the way P2's rows run. One command, with a profiler beside it:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/11 \\
    .venv/bin/python bench/execute_loop.py --seconds 20 &
    sleep 8; perf record -a -g -o /tmp/perf.data -- sleep 6
    perf report -i /tmp/perf.data --no-children --sort comm -g none --stdio
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run  # sets Django up
from holdfast_devtools import processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from controlplane.owners.actions import ensure

    ensure("bench")
    token = secrets.token_urlsafe(32)
    host = processes.start_host(token, host_id="bench")
    try:
        time.sleep(0.5)
        env = {"HOLDFAST_SANDBOX_URL": processes.host_url(host), "HOLDFAST_SANDBOX_TOKEN": token}
        worker = processes.start_worker(env, concurrency=4, name="bench-worker")
        try:
            run.via_execute(10)
            samples: list[float] = []
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                samples += run.via_execute(20)
        finally:
            worker.stop()
    finally:
        host.stop()
    print(f"execute() back to back: {len(samples)} calls, p50 {statistics.median(samples) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
