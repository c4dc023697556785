"""A worker keeps its PostgreSQL connection from task to task (CONN_MAX_AGE), as a web
process does from request to request, and replaces one the server dropped before the
next task uses it. Celery's Django fixup alone opens a new connection for every task."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection

from controlplane.celery import app
from tests.support.tasks import BACKEND_PID
from tests.support.worker import start_worker
from tests.timing import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.peer]


def _run(path, count: int) -> list[int]:
    """Send the task, wait for its line; one task at a time."""
    app.send_task(BACKEND_PID, args=[str(path)], queue=settings.CELERY_TASK_DEFAULT_QUEUE)

    def lines():
        found = path.read_text().split() if path.exists() else []
        return [int(pid) for pid in found] if len(found) >= count else None

    return wait_until(lines, timeout=30, what=f"task {count} to report")


@pytest.fixture
def worker():
    with start_worker({}, concurrency=1, extra_args=("--include", "tests.support.tasks")) as running:
        yield running


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL backends")
def test_a_worker_reuses_its_database_connection_across_tasks(worker, tmp_path):
    path = tmp_path / "pids"
    for count in (1, 2, 3):
        pids = _run(path, count)
    assert len(set(pids)) == 1, pids


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL backends")
def test_a_connection_the_server_dropped_is_replaced_before_the_next_task(worker, tmp_path):
    path = tmp_path / "pids"
    (first,) = _run(path, 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    pids = _run(path, 2)
    assert pids[1] != first, pids
