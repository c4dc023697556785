"""What storing a result costs from the worker, alone: the one statement ``finish``
runs on PostgreSQL (the result, the turn lock and a parked nudge taken back, the
notification) against the plain task's UPDATE of the same row, alternated twice, one
LISTEN connection attached as a caller's process would hold. One command:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    .venv/bin/python bench/finish_cost.py

To price a change to the statement, run it again with the old ``actions.py`` checked
out (``git checkout REV -- controlplane/executions/actions.py``).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run  # sets Django up

N = 60
# Between two ends, as between executions: the database idles a little, as it does.
PAUSE_S = 0.01


def main() -> None:
    from django.utils import timezone

    from controlplane.executions import actions, notify
    from controlplane.executions.models import Execution, Status
    from controlplane.pool.outcome import Outcome

    listening = run.postgres_listening(notify.CHANNEL, "finish_cost")

    def running() -> str:
        row = actions.create("print(1)", owner="bench", timeout_s=10, memory_mb=256)
        Execution.objects.filter(pk=row.pk).update(status=Status.RUNNING, started_at=timezone.now())
        return str(row.pk)

    def plain(pk: str) -> None:
        Execution.objects.filter(pk=pk, status=Status.RUNNING).update(
            status=Status.SUCCEEDED, stdout="1\n", exit_code=0, finished_at=timezone.now()
        )

    def finish(pk: str) -> None:
        actions.finish(pk, Outcome("succeeded", exit_code=0, stdout="1\n", duration_ms=1, host_id="bench"))

    print(f"{'storing one result, from this process':<44} {'p50 ms':>8}")
    try:
        for what, store in (("finish (one statement)", finish), ("plain UPDATE", plain)) * 2:
            took = []
            for _ in range(N):
                pk = running()
                time.sleep(PAUSE_S)
                started = time.perf_counter()
                store(pk)
                took.append(time.perf_counter() - started)
            print(f"{what:<44} {statistics.median(took) * 1000:>8.2f}")
    finally:
        listening.close()


if __name__ == "__main__":
    main()
