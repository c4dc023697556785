"""Tasks loaded only into test workers (``--include tests.support.tasks``)."""

from pathlib import Path

from celery import shared_task

BACKEND_PID = "tests.support.tasks.backend_pid"


@shared_task(name=BACKEND_PID)
def backend_pid(path: str) -> None:
    """Append the PostgreSQL backend pid this task's query ran on to ``path``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with Path(path).open("a") as fh:
        fh.write(f"{pid}\n")
