"""The baseline for the full path: a plain Celery task that does the same database work
as an execution (claim the row, store a result) but runs nothing in a sandbox. Loaded
only into the benchmark's worker (``celery worker --include bench.tasks``)."""

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
