"""The baselines for the full path: a plain Celery task that does the same database work
as an execution (claim the row, store a result) but runs nothing in a sandbox, and one
that does it through Holdfast's own claim and finish. Loaded only into the benchmark's
worker (``celery worker --include bench.tasks``)."""

from celery import shared_task
from django.utils import timezone


@shared_task(name="bench.tasks.plain_task")
def plain_task(execution_id: str) -> None:
    from controlplane.executions.models import Execution, Status

    if Execution.objects.filter(pk=execution_id, status=Status.QUEUED).update(
        status=Status.RUNNING, started_at=timezone.now()
    ):
        Execution.objects.filter(pk=execution_id, status=Status.RUNNING).update(
            status=Status.SUCCEEDED, stdout="1\n", exit_code=0, finished_at=timezone.now()
        )


@shared_task(name="bench.tasks.fair_task")
def fair_task(execution_id: str) -> None:
    """The same through Holdfast's own database steps: the fair-dispatch claim and the
    one-statement finish (parked nudge and notification included); no pool, no host."""
    from controlplane.executions import actions, dispatch
    from controlplane.pool.outcome import Outcome

    claimed = dispatch.claim_next(worker="bench")
    if claimed is not None:
        actions.finish(claimed.id, Outcome("succeeded", exit_code=0, stdout="1\n", duration_ms=1, host_id="bench"))
