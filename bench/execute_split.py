"""What ``execute()`` pays beyond the plain task, split in two: rounds of the notified
plain task (P2's baseline), of Holdfast's own claim and finish without a sandbox woken
by the process's result listener as ``execute()`` is (``bench.tasks.fair_task``), and of
``execute()`` itself, each back to back on a real host and worker; for the last two
the caller's submit (row committed, message published) is timed apart. The submit is
the same code in both, so where it is slower beside ``execute()``, something the
execution left behind slows the next call. ``--pause-s`` waits after each call (the
pause is not timed); ``--reserve`` sets the host's reserve. One command:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/11 \\
    .venv/bin/python bench/execute_split.py --rounds 3 [--pause-s 0.005] [--reserve 58]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run  # sets Django up


def listened(n: int, submit, pause_s: float) -> tuple[list[float], list[float]]:
    """``n`` calls of ``submit(id)`` each woken by the process's listener: the whole
    call and the submit alone, in seconds."""
    from controlplane.executions import notify

    listener = notify.listener()
    if listener is None or not listener.ready(5):
        raise SystemExit("execute_split: PostgreSQL only (the listener needs NOTIFY)")
    calls, submits = [], []
    for _ in range(n):
        started = time.perf_counter()
        execution_id = uuid.uuid4()
        woken = listener.register(str(execution_id))
        try:
            submit(execution_id)
            submits.append(time.perf_counter() - started)
            if not woken.wait(10):
                raise SystemExit("execute_split: no result within 10 s")
            if woken.result is None or woken.result["status"] != "succeeded":
                raise SystemExit(f"execute_split: the call did not succeed: {woken.result}")
            calls.append(time.perf_counter() - started)
        finally:
            listener.unregister(str(execution_id), woken)
        time.sleep(pause_s)
    return calls, submits


def fair(execution_id) -> None:
    from bench.tasks import fair_task
    from controlplane.executions import actions

    actions.create(run.SNIPPET, owner="bench", timeout_s=10, memory_mb=256, execution_id=execution_id)
    fair_task.delay(str(execution_id))


def executed(execution_id) -> None:
    from controlplane.executions import api

    api._submit(run.SNIPPET, owner="bench", timeout_s=10, memory_mb=None, execution_id=execution_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=40, help="calls of each kind per round")
    parser.add_argument("--pause-s", type=float, default=0.0, help="after each call, not timed")
    parser.add_argument("--reserve", type=int, default=None, help="the host's --reserve (default: its own)")
    args = parser.parse_args()
    run.prepare_database()
    with run.host_and_worker(secrets.token_urlsafe(32), reserve=args.reserve) as (host, _):
        run.via_notified_task(3)
        listened(3, fair, 0.0)
        listened(3, executed, 0.0)
        print(f"ms p50, {args.n} calls each, pause {args.pause_s * 1000:g} ms after each but the baseline's")
        for _ in range(args.rounds):
            run.wait_for_reserve(host, args.reserve)  # refilled after the last round, nothing beside
            base = statistics.median(run.via_notified_task(args.n)) * 1000
            fair_calls, fair_submits = listened(args.n, fair, args.pause_s)
            calls, submits = listened(args.n, executed, args.pause_s)
            f50, fs50 = (statistics.median(x) * 1000 for x in (fair_calls, fair_submits))
            e50, es50 = (statistics.median(x) * 1000 for x in (calls, submits))
            print(
                f"notified {base:.2f}; claim+finish+listener {f50:.2f} (submit {fs50:.2f}) {f50 / base:.2f}x; "
                f"execute() {e50:.2f} (submit {es50:.2f}) {e50 / base:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
