"""Owner B's completion times while owner A floods, against B alone, in the same run
(issue 13; goal: B's p95 under the flood within 2x of B alone).

    .venv/bin/python bench/fairness.py [--flood 2000] [--n 40] [--interval 0.2] [--a-max-active 3]

A real sandbox host and a real Celery worker (``--concurrency`` threads). Each phase
starts a fresh worker; in the flood phase A's ``--flood`` executions are queued first
(the worker would otherwise keep up with one submitting thread and no backlog would
form). Then B submits ``--n`` executions one every ``--interval`` seconds, as a service
would, and each one's completion time is its row's finished_at - created_at. A's
executions left queued after B's last one are cancelled. Uses whatever DATABASE_URL /
CELERY_BROKER_URL are set.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import django_env  # noqa: E402

django_env.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from bench.run import ms  # noqa: E402
from holdfast_devtools import processes  # noqa: E402

SNIPPET = "print(1)"
A, B = "bench-flood-a", "bench-flood-b"


def phase(env: dict[str, str], *, flood: int, n: int, interval: float, concurrency: int) -> tuple[dict, int]:
    """B's completion times and their two parts (seconds): queued (created -> claimed)
    and running (claimed -> finished); and how many of A's were still queued at B's end."""
    from controlplane.executions.api import submit
    from controlplane.executions.models import TERMINAL, Execution

    for _ in range(flood):
        submit(SNIPPET, owner=A, timeout_s=30)
    worker = processes.start_worker(env, concurrency=concurrency, name="bench-fair-worker")
    try:
        ids = []
        for _ in range(n):
            ids.append(submit(SNIPPET, owner=B, timeout_s=30))
            time.sleep(interval)
        deadline = time.monotonic() + 300
        while Execution.objects.filter(pk__in=ids, status__in=TERMINAL).count() < n:
            if time.monotonic() > deadline:
                raise SystemExit("bench: B's executions did not finish within 300 s")
            time.sleep(0.05)
        a_left = Execution.objects.filter(owner=A, status="queued").count()
        Execution.objects.filter(owner=A, status="queued").update(status="cancelled")
    finally:
        worker.stop()
    rows = Execution.objects.filter(pk__in=ids)
    bad = [r for r in rows if r.status != "succeeded"]
    if bad:
        raise SystemExit(f"bench: {len(bad)} of B's executions failed: {bad[0].status} {bad[0].error}")
    return {
        "completion": [(r.finished_at - r.created_at).total_seconds() for r in rows],
        "queued": [(r.started_at - r.created_at).total_seconds() for r in rows],
        "running": [(r.finished_at - r.started_at).total_seconds() for r in rows],
    }, a_left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=2000, help="A's executions queued before B starts")
    parser.add_argument("--n", type=int, default=40, help="B's executions per phase")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between two of B's submits")
    parser.add_argument("--concurrency", type=int, default=4, help="worker threads (dispatch slots)")
    parser.add_argument(
        "--a-max-active", type=int, default=0, help="also measure with A capped at this many running (0: skip)"
    )
    args = parser.parse_args()
    for folder in ("queue", "processed", "control"):
        (settings.VAR_DIR / "broker" / folder).mkdir(parents=True, exist_ok=True)
    call_command("migrate", verbosity=0, interactive=False)
    from controlplane.owners.actions import ensure
    from controlplane.owners.models import Owner

    ensure(A)
    ensure(B)
    # Caps large enough for the flood: this measures dispatch order, not admission.
    Owner.objects.filter(name=A).update(max_queued=max(args.flood, 1), max_active=None)
    token = secrets.token_urlsafe(32)
    host = processes.start_host(token, host_id="bench-fairness")
    try:
        env = {"HOLDFAST_SANDBOX_URL": processes.host_url(host), "HOLDFAST_SANDBOX_TOKEN": token}
        alone, _ = phase(env, flood=0, n=args.n, interval=args.interval, concurrency=args.concurrency)
        flooded, a_left = phase(env, flood=args.flood, n=args.n, interval=args.interval, concurrency=args.concurrency)
        phases = [("B alone (baseline)", alone), ("B while A floods", flooded)]
        if args.a_max_active:
            # Headroom: A never holds every slot, so one is free when B's work arrives.
            Owner.objects.filter(name=A).update(max_active=args.a_max_active)
            capped, _ = phase(env, flood=args.flood, n=args.n, interval=args.interval, concurrency=args.concurrency)
            phases.append((f"B while A floods, A max_active={args.a_max_active}", capped))
            Owner.objects.filter(name=A).update(max_active=None)
    finally:
        host.stop()
    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(f"\nHoldfast fairness bench: B n={args.n} every {args.interval:g} s, A flood={args.flood}, "
          f"{args.concurrency} dispatch slots, database={db}, cpus={os.cpu_count()}\n")  # fmt: skip
    print(f"{'owner B, ms':<42}  {'p50':>7}  {'p95':>7}  {'queued p50':>10}  {'queued p95':>10}  {'running p50':>11}")
    for label, found in phases:
        c50, c95 = ms(found["completion"])
        q50, q95 = ms(found["queued"])
        r50, _ = ms(found["running"])
        print(f"{label:<42}  {c50:>7.1f}  {c95:>7.1f}  {q50:>10.1f}  {q95:>10.1f}  {r50:>11.1f}")
    base95 = ms(alone["completion"])[1]
    print(f"\nB's p95 completion while A floods = {ms(flooded['completion'])[1] / base95:.2f}x B alone (goal <= 2x); "
          f"A still had {a_left} of {args.flood} queued when B's last execution finished")  # fmt: skip
    if args.a_max_active:
        print(f"with A capped at {args.a_max_active} running: {ms(phases[2][1]['completion'])[1] / base95:.2f}x")


if __name__ == "__main__":
    main()
