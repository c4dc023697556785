"""A real Celery worker process for tests (STYLE habit 8: not eager mode), started the
same way the main job starts one (holdfast_devtools/processes.py), against the test
database pytest-django created."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from holdfast_devtools import processes
from tests.timing import scaled


class WorkerProcess:
    def __init__(self, child: processes.Child) -> None:
        self.child = child
        self.popen = child.popen

    @property
    def lines(self) -> list[str]:
        return self.child.lines

    def output(self) -> str:
        return "\n".join(self.child.lines)

    def stop(self) -> int:
        # SIGTERM is Celery's warm shutdown: running tasks finish first.
        return self.child.stop(timeout=scaled(60))


def children_database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    user, host, port = db["USER"] or "postgres", db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    return f"postgres://{user}@{host}:{port}/{db['NAME']}"


@contextlib.contextmanager
def start_worker(
    env: dict[str, str], *, concurrency: int = 8, extra_args: tuple[str, ...] = ()
) -> Iterator[WorkerProcess]:
    """Start ``celery worker`` against the test database and broker. ``env`` adds to
    (and overrides) this process's environment: the pool's settings go there."""
    child_env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": children_database_url(), **env}
    worker = WorkerProcess(
        processes.start_worker(child_env, concurrency=concurrency, name="test-worker", extra_args=extra_args)
    )
    try:
        yield worker
    finally:
        worker.stop()
