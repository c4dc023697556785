"""Deadlines (issue 9): no run stays live past a bound it was given. Real PostgreSQL;
the Celery messages the deadline path publishes are read back from the real broker."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from controlplane.runs import actions, reconcile
from controlplane.runs.models import Run, RunNotification, RunStatus

from .conftest import running_on
from .fake_driver import FakeProbeDriverForInterleavings

pytestmark = pytest.mark.django_db

NO_HOSTS = FakeProbeDriverForInterleavings({})


def _published_launches() -> list[str]:
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    ids = []
    for raw in broker.lrange(settings.CELERY_TASK_DEFAULT_QUEUE, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == "controlplane.runs.tasks.launch_run":
            ids.append(json.loads(__import__("base64").b64decode(message["body"]))[0][0])
    return ids


@pytest.fixture(autouse=True)
def _empty_queue():
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    yield
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)


def test_a_run_queued_past_the_launch_deadline_is_relaunched_once_then_fails_as_launch_lost():
    run = actions.create_run("acme", {"kind": "shell", "command": "true"}, callback_url="http://127.0.0.1:9/x")
    deadline = timedelta(seconds=settings.RUN_LAUNCH_DEADLINE_S)
    now = timezone.now()

    assert reconcile.tick(now=now, driver=NO_HOSTS).relaunched == []  # inside the deadline
    first = reconcile.tick(now=now + deadline + timedelta(seconds=1), driver=NO_HOSTS)
    assert first.relaunched == [str(run.id)]
    assert _published_launches() == [str(run.id)]
    again = reconcile.tick(now=now + deadline + timedelta(seconds=2), driver=NO_HOSTS)
    assert again.relaunched == [] and not again.failed  # once, and the relaunch gets its own deadline

    late = reconcile.tick(now=now + 2 * deadline + timedelta(seconds=5), driver=NO_HOSTS)
    assert late.failed["launch_lost"] == [str(run.id)]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error.startswith("launch_lost")
    assert RunNotification.objects.filter(run=run).count() == 1


def test_a_runner_that_says_hello_after_the_relaunch_is_not_failed():
    run = actions.create_run("acme", {"kind": "shell", "command": "true"})
    claim = actions.claim_for_launch(run.id)
    deadline = timedelta(seconds=settings.RUN_LAUNCH_DEADLINE_S)
    now = timezone.now()
    assert reconcile.tick(now=now + deadline + timedelta(seconds=1), driver=NO_HOSTS).relaunched == [str(run.id)]
    actions.runner_hello(run.id, "late-instance")  # the runner made it after all
    assert claim.launch_key
    late = reconcile.tick(now=now + 3 * deadline, driver=NO_HOSTS)
    assert not late.failed
    assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING


def test_a_run_past_its_timeout_plus_the_margin_fails_as_deadline_exceeded_and_its_sandbox_is_stopped(
    django_capture_on_commit_callbacks,
):
    placed = running_on("host-a")
    run = placed.row()
    timeout_s = run.job["timeout_s"]
    at_limit = run.started_at + timedelta(seconds=timeout_s + settings.RUN_DEADLINE_MARGIN_S)
    alive = FakeProbeDriverForInterleavings({"host-a": {placed.run_id: "running"}})

    assert not reconcile.tick(now=at_limit - timedelta(seconds=1), driver=alive).failed
    with django_capture_on_commit_callbacks(execute=True):
        report = reconcile.tick(now=at_limit + timedelta(seconds=1), driver=alive)
    assert report.failed["deadline_exceeded"] == [placed.run_id]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error.startswith("deadline_exceeded")
    assert not placed.keys_live()
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    tasks = [json.loads(m)["headers"]["task"] for m in broker.lrange(settings.CELERY_TASK_DEFAULT_QUEUE, 0, -1)]
    assert "controlplane.runs.tasks.stop_run_sandbox" in tasks
