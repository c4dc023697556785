"""What finished executions left behind cost the next ones, on PostgreSQL: each
execution's row is written three times (queued, running, a terminal status), and every
version leaves an entry in the indexes on ``status``. Until VACUUM removes them, the
admission's counts and the fair claim walk the dead ``queued`` and ``running`` entries of
every execution since. This runs executions' database steps (``actions.create``,
``dispatch.claim_next``, ``actions.finish``; no Celery, no host) in batches, prints each
step's p50 per batch as the dead entries grow, then VACUUMs and measures once more.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    .venv/bin/python bench/queue_churn.py [--batches 6] [--per-batch 500]

It VACUUMs the executions table before it starts, and again before its last batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run  # noqa: F401 - sets Django up, as the other benches


def vacuum() -> None:
    from django.db import connection

    from controlplane.executions.models import Execution

    table = connection.ops.quote_name(Execution._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {table}")


def batch(n: int) -> dict[str, float]:
    """``n`` executions' database steps, one at a time: each step's p50 in ms."""
    from controlplane.executions import actions, dispatch
    from controlplane.pool.outcome import Outcome

    steps: dict[str, list[float]] = {"create": [], "claim": [], "finish": []}
    for _ in range(n):
        t0 = time.perf_counter()
        actions.create("print(1)", owner="bench", timeout_s=10, memory_mb=256)
        t1 = time.perf_counter()
        claimed = dispatch.claim_next(worker="bench")
        t2 = time.perf_counter()
        if claimed is None:
            raise SystemExit("queue_churn: nothing to claim (is a worker of another bench running?)")
        actions.finish(claimed.id, Outcome("succeeded", exit_code=0, stdout="1\n", duration_ms=1, host_id="bench"))
        t3 = time.perf_counter()
        for name, value in zip(steps, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            value *= 1000
            steps[name].append(value)
    return {name: statistics.median(values) for name, values in steps.items()}


def main() -> None:
    from django.core.management import call_command
    from django.db import connection

    from controlplane.owners.actions import ensure

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--per-batch", type=int, default=500)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("queue_churn: PostgreSQL only")
    call_command("migrate", verbosity=0, interactive=False)
    ensure("bench")
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        autovacuum = cursor.fetchone()[0]
    print(f"autovacuum {autovacuum}; {args.per_batch} executions per batch, one at a time")
    print(f"{'executions since VACUUM':>24} {'create p50 ms':>14} {'claim p50 ms':>13} {'finish p50 ms':>14}")
    vacuum()
    done = 0
    for i in range(args.batches + 1):
        if i == args.batches:
            vacuum()
            done = 0
        found = batch(args.per_batch)
        label = f"{done}-{done + args.per_batch}"
        print(f"{label:>24} {found['create']:>14.2f} {found['claim']:>13.2f} {found['finish']:>14.2f}")
        done += args.per_batch


if __name__ == "__main__":
    main()
