"""``manage.py reconcile --once`` runs the beat's tick and prints what it saw and did;
the beat schedule runs the same task every HOLDFAST_RECONCILE_INTERVAL_S."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from controlplane.runs.models import Run, RunNotification, RunStatus

from .conftest import running_on

pytestmark = pytest.mark.django_db


def test_reconcile_once_probes_through_the_configured_driver_and_prints_its_report(settings):
    settings.SANDBOX_URL = "ws://127.0.0.1:9"  # nothing listens: the host is silent
    settings.SANDBOX_TOKEN = "t"
    settings.RUNS_LAUNCH_DRIVER = ""
    placed = running_on("host-far")
    out = io.StringIO()
    call_command("reconcile", "--once", stdout=out)
    text = out.getvalue()
    assert "probed hosts: host-far (1 runs)" in text
    assert "silent hosts: host-far" in text
    assert "loss stamped: 0" in text and "failed sandbox_lost: 0" in text
    assert Run.objects.get(pk=placed.run_id).status == RunStatus.RUNNING


def test_reconcile_without_once_says_how_it_is_scheduled():
    with pytest.raises(CommandError, match="HOLDFAST_RECONCILE_INTERVAL_S"):
        call_command("reconcile")


def test_the_beat_schedule_runs_reconcile_every_interval():
    entry = settings.CELERY_BEAT_SCHEDULE["runs-reconcile"]
    assert entry["task"] == "controlplane.runs.tasks.reconcile_runs"
    assert entry["schedule"] == settings.RECONCILE_INTERVAL_S == 30.0


def test_a_notification_whose_message_was_lost_is_published_again(settings):
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    placed = running_on("host-a")
    notification = RunNotification.objects.create(run_id=placed.run_id, status="failed", url="http://127.0.0.1:9/")
    RunNotification.objects.filter(pk=notification.pk).update(created_at=timezone.now() - timedelta(hours=2))
    settings.SANDBOX_URL = ""
    out = io.StringIO()
    call_command("reconcile", "--once", stdout=out)
    assert "notifications republished: 1" in out.getvalue()
    assert broker.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 1
    broker.delete(settings.CELERY_TASK_DEFAULT_QUEUE)


def test_drain_host_reports_the_live_runs_a_drained_host_still_holds():
    from django.core.cache import cache

    from controlplane.hosts import snapshots
    from controlplane.hosts.models import SandboxHost

    cache.delete(snapshots.INDEX_KEY)
    SandboxHost.objects.create(name="h-drain", host_id="h-drain")
    running_on("h-drain")
    running_on("h-drain")
    out = io.StringIO()
    call_command("drain_host", "h-drain", "--timeout", "1", stdout=out)
    assert "h-drain: empty" in out.getvalue() and "live runs still on it 2" in out.getvalue()
