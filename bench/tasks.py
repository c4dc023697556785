"""The baselines for the full path: a plain Celery task that does the same database work
as an execution (claim the row, store a result) but runs nothing in a sandbox; the same
whose result's statement also notifies, so its caller is woken as ``execute()``'s is
instead of polling; and one that does it through Holdfast's own claim and finish.
Loaded only into the benchmark's worker (``celery worker --include bench.tasks``)."""

from celery import shared_task
from django.db import connection
from django.utils import timezone

# The channel the notified baseline wakes its caller on (bench.run.via_notified_task).
NOTIFIED_CHANNEL = "holdfast_bench_plain_done"
# Its result's statement: a quoted table name put in, every value a parameter.
NOTIFIED_SQL = (
    "WITH done AS (UPDATE {table} SET status = %s, stdout = %s, exit_code = 0, finished_at = %s "
    "WHERE id = %s AND status = %s RETURNING id) SELECT pg_notify(%s, id::text) FROM done"
)


@shared_task(name="bench.tasks.plain_task")
def plain_task(execution_id: str) -> None:
    from controlplane.executions.models import Execution, Status

    if Execution.objects.filter(pk=execution_id, status=Status.QUEUED).update(
        status=Status.RUNNING, started_at=timezone.now()
    ):
        Execution.objects.filter(pk=execution_id, status=Status.RUNNING).update(
            status=Status.SUCCEEDED, stdout="1\n", exit_code=0, finished_at=timezone.now()
        )


@shared_task(name="bench.tasks.notified_task")
def notified_task(execution_id: str) -> None:
    """``plain_task`` whose result's UPDATE also sends the row's id on NOTIFIED_CHANNEL
    in the same statement (delivered once it commits), as execute()'s result is sent:
    the plain round trip with nothing lost to a caller's poll interval."""
    from controlplane.executions.models import Execution, Status

    if Execution.objects.filter(pk=execution_id, status=Status.QUEUED).update(
        status=Status.RUNNING, started_at=timezone.now()
    ):
        table = connection.ops.quote_name(Execution._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                NOTIFIED_SQL.format(table=table),
                [Status.SUCCEEDED, "1\n", timezone.now(), execution_id, Status.RUNNING, NOTIFIED_CHANNEL],
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
