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
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import django_env  # noqa: E402

django_env.setup()

from django.conf import settings  # noqa: E402

from holdfast_devtools import processes  # noqa: E402

SNIPPET = "print(1)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--pause-s", type=float, default=0.05, help="between executions")
    args = parser.parse_args()
    for folder in ("queue", "processed", "control"):
        (settings.VAR_DIR / "broker" / folder).mkdir(parents=True, exist_ok=True)
    from bench import run

    run.prepare_database()
    from controlplane.executions import api, notify

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
            # execute()'s own steps, with a mark between submit and wait.
            marks = [(time.time(), "submit called")]
            execution_id = uuid.uuid4()
            listener = notify.listener()
            woken = listener.register(str(execution_id)) if listener and listener.ready(2) else None
            api._submit(SNIPPET, owner="bench", timeout_s=10, memory_mb=None, execution_id=execution_id)
            marks.append((time.time(), "submitted (row committed, nudge published)"))
            result = api._wait(execution_id, woken, cancel=None, wait_s=None, pickup_wait_s=None, registered_first=True)
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
    report(runs, [(float(t), what) for t, what in worker_marks])


# The chain one execution goes through, in order. ``submitted`` is the caller's own
# return from submit(), which the worker's first steps overlap: reported on its own.
CHAIN = (
    "submit called",
    "task received",
    "task started",
    "claimed (fair dispatch)",
    "code read, pool called",
    "host answered (pool)",
    "result stored, parked nudge back, notified",
    "task ended",
    "caller has the result",
)
SUBMITTED = "submitted (row committed, nudge published)"


def report(runs: list[list[tuple[float, str]]], worker_marks: list[tuple[float, str]]) -> None:
    steps: dict[str, list[float]] = {what: [] for what in (SUBMITTED, *CHAIN[1:], "execute() total")}
    for marks in runs:
        start, end = marks[0][0], marks[-1][0]
        at = {what: t for t, what in marks}
        for t, what in worker_marks:
            if start <= t <= end:
                at.setdefault(what, t)
        steps[SUBMITTED].append((at[SUBMITTED] - start) * 1000)
        previous = start
        for what in CHAIN[1:]:
            if what in at:
                steps[what].append((at[what] - previous) * 1000)
                previous = at[what]
        steps["execute() total"].append((end - start) * 1000)
    print(f"{'step (ms since the step before; submit: since the call)':<58} {'p50':>7} {'p90':>7}")
    for what, values in steps.items():
        if values:
            values.sort()
            print(f"{what:<58} {statistics.median(values):>7.2f} {values[int(len(values) * 0.9)]:>7.2f}")


if __name__ == "__main__":
    main()
