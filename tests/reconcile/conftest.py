"""Helpers for the reconcile tests: a running run placed on a host, as the launch task
and the runner's hello leave it, with a callback URL so notifications are recorded; and
a real host that can be restarted as the same host (``host``, ``drive_host``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import pytest
import redis
from django.conf import settings
from django.test import Client

from controlplane.runs import actions
from controlplane.runs.models import Run, RunEvent, RunNotification, RunStatus
from tests.integration.support import free_port, stop_runs
from tests.runs.conftest import JOB, SECRET, RunnerCalls
from tests.support.owners import use_in_database_tests

from .hosts import TOKEN, RestartableHost


@pytest.fixture
def host(tmp_path) -> Iterator[RestartableHost]:
    running = RestartableHost(tmp_path / "state", free_port())
    running.start()
    try:
        yield running
    finally:
        running.stop()
        stop_runs(running.state_dir)


@pytest.fixture
def drive_host(settings, host):
    """This process's ticks reach the host as the worker's launches do."""
    settings.SANDBOX_URL = host.url
    settings.SANDBOX_TOKEN = TOKEN
    settings.RUNS_LAUNCH_DRIVER = ""
    return host


HOST = "host-a"
CALLBACK = "http://127.0.0.1:9/callback"  # never reached here: nothing consumes the queue


@pytest.fixture(autouse=True)
def _drop_published_messages():
    """Ticks publish real messages (relaunches, stops, notifications) for rows a test
    rolls back: drop them so a later test's worker never picks them up."""
    yield
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)


@dataclass
class Placed:
    run_id: str
    calls: RunnerCalls

    def row(self) -> Run:
        return Run.objects.get(pk=self.run_id)

    def keys_live(self) -> bool:
        return self.calls.get("bundle").status_code == 200


def running_on(host: str = HOST, *, stamp: datetime | None = None, callback_url: str = CALLBACK) -> Placed:
    run = actions.create_run("acme", JOB, {"API_TOKEN": SECRET}, callback_url=callback_url)
    claim = actions.claim_for_launch(run.id)
    calls = RunnerCalls(Client(), str(run.id))
    answer = calls.post("hello", {"instance_id": "sandbox-1"}, token=claim.launch_key)
    assert answer.status_code == 200, answer.content
    calls.token = answer.json()["session_token"]
    Run.objects.filter(pk=run.id).update(host_id=host, loss_observed_at=stamp)
    return Placed(str(run.id), calls)


def assert_failed_once_as_lost(placed: Placed) -> None:
    run = placed.row()
    assert run.status == RunStatus.FAILED and run.error.startswith("sandbox_lost"), (run.status, run.error)
    assert run.key_revoked_at is not None and run.secrets == {}
    assert not placed.keys_live()
    assert RunEvent.objects.filter(run_id=placed.run_id, type="result").count() == 1
    assert hasattr(run, "receipt")
    assert RunNotification.objects.filter(run_id=placed.run_id).count() == 1


def assert_still_running_with_keys(placed: Placed) -> None:
    run = placed.row()
    assert run.status == RunStatus.RUNNING, (run.status, run.error)
    assert run.key_revoked_at is None and run.secrets == {"API_TOKEN": SECRET}
    assert placed.keys_live()
    assert not RunNotification.objects.filter(run_id=placed.run_id).exists()


@pytest.fixture(autouse=True)
def _suite_owners(request):
    """Every test here may create runs for the suite's owners (tests/support/owners.py)."""
    use_in_database_tests(request)
