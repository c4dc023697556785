"""Fixtures shared by the suite. Real parts only: PostgreSQL, Redis, host and worker
processes on loopback ports (see tests/support/)."""

from __future__ import annotations

import secrets
import time

import pytest


@pytest.fixture
def sandbox_token() -> str:
    return "hf-test-" + secrets.token_hex(16)


@pytest.fixture(scope="session", autouse=True)
def _purge_test_queue() -> None:
    """Drop messages an aborted earlier run may have left in this session's queue."""
    from django.conf import settings

    if settings.CELERY_BROKER_URL.startswith("redis://"):
        import redis

        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)


@pytest.fixture(scope="session", autouse=True)
def _results_listener_closed(django_db_setup):
    """execute()'s LISTEN connection must be gone before the test database is dropped
    (set up after the database, so torn down before it)."""
    yield
    from controlplane.executions import notify

    notify.shutdown()


@pytest.fixture
def shared_dir():
    """A directory a sandboxed child (which may run under another uid) can write to,
    so a test can count how many times a snippet really ran."""
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="holdfast-test-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def owners():
    """The owners the suite's tests submit work for (tests/support/owners.py)."""
    from tests.support.owners import create_suite_owners

    return create_suite_owners()


@pytest.fixture
def pinned_rate_clock(monkeypatch):
    """Rate-limit windows counted on one instant (now) for the whole test: the requests
    of a test of a limit all fall in one fixed window, however slow the machine."""
    from controlplane import ratelimit

    instant = time.time()
    monkeypatch.setattr(ratelimit, "clock", lambda: instant)
    return instant
