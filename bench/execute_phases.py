"""Where an ``execute()`` of a trivial snippet spends its time, step by step: the
caller's submit, the Celery hop, the fair-dispatch claim, the pool and host, the result
write and its notification, the caller woken. A real host and a real Celery worker,
whose task steps are timestamped by ``bench/phase_marks.py``; executions one at a time
with a short pause (the host's reserve refills). One command:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/11 \\
    .venv/bin/python bench/execute_phases.py --n 40
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from holdfast_devtools import processes  # noqa: E402

SNIPPET = "print(1)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--pause-s", type=float, default=0.05, help="between executions")
    args = parser.parse_args()
    for folder in ("queue", "processed", "control"):
        (settings.VAR_DIR / "broker" / folder).mkdir(parents=True, exist_ok=True)
    call_command("migrate", verbosity=0, interactive=False)
    from controlplane.executions import api, notify
    from controlplane.owners.actions import ensure

    ensure("bench")
    marks_path = Path(tempfile.mkstemp(prefix="holdfast-marks-")[1])
    token = secrets.token_urlsafe(32)
    host = processes.start_host(token, host_id="bench")
    env = {
        "HOLDFAST_SANDBOX_URL": processes.host_url(host),
        "HOLDFAST_SANDBOX_TOKEN": token,
        "HOLDFAST_BENCH_MARKS": str(marks_path),
    }
    marked = ("--include", "bench.phase_marks")
    worker = processes.start_worker(env, concurrency=4, name="bench-worker", extra_args=marked)
    runs: list[list[tuple[float, str]]] = []
    try:
        for i in range(args.n + 3):  # the first three warm the worker, the pool and the listener
            marks = [(time.time(), "submit called")]
            execution_id = api.submit(SNIPPET, owner="bench", timeout_s=10)
            marks.append((time.time(), "submitted (row committed, nudge published)"))
            listener = notify.listener()
            woken = listener.register(str(execution_id)) if listener and listener.ready(2) else None
            result = api._wait(execution_id, woken, cancel=None, wait_s=None, pickup_wait_s=None)
            marks.append((time.time(), "caller has the result"))
            if listener and woken:
                listener.unregister(str(execution_id), woken)
            if result.status != "succeeded":
                raise SystemExit(f"execute_phases: execution failed: {result}")
            if i >= 3:
                runs.append(marks)
            time.sleep(args.pause_s)
    finally:
        worker.stop()
        host.stop()
    worker_marks = [line.split(" ", 1) for line in marks_path.read_text().splitlines()]
    marks_path.unlink()
    steps: dict[str, list[float]] = {}
    totals = []
    for marks in runs:
        start, end = marks[0][0], marks[-1][0]
        inside = [(float(t), what) for t, what in worker_marks if start <= float(t) <= end]
        ordered = sorted(marks[:2] + inside + marks[2:])
        for (before, _), (at, what) in itertools.pairwise(ordered):
            steps.setdefault(what, []).append((at - before) * 1000)
        totals.append((end - start) * 1000)
    print(f"{'step (time since the previous one)':<46} {'p50 ms':>8} {'p90 ms':>8}")
    for what, values in steps.items():
        values.sort()
        print(f"{what:<46} {statistics.median(values):>8.2f} {values[int(len(values) * 0.9)]:>8.2f}")
    totals.sort()
    print(f"{'execute() total':<46} {statistics.median(totals):>8.2f} {totals[int(len(totals) * 0.9)]:>8.2f}")


if __name__ == "__main__":
    main()
