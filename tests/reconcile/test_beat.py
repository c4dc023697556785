"""Issue 9: Celery beat runs reconcile on its own. A real beat process (interval 1 s), a
real worker running the ticks through the WebSocket driver against a real host, and a
run whose sandbox that host has no record of: it is stamped, then failed as
``sandbox_lost`` once the (short) grace has run out, with no tick run by the test."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from controlplane.runs.models import Run, RunStatus
from holdfast_devtools import processes
from tests.support.worker import children_database_url, start_worker
from tests.timing import scaled, wait_until

from .conftest import running_on
from .hosts import HOST_ID, TOKEN

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.peer]


@contextlib.contextmanager
def start_beat(env: dict[str, str], schedule: Path) -> Iterator[processes.Child]:
    argv = [sys.executable, "-m", "celery", "-A", "controlplane", "beat", "-s", str(schedule), "--loglevel", "INFO"]
    beat = processes.Child("beat", argv, {**os.environ, **env}, re.compile(r"beat: Starting"))
    beat.wait_ready(scaled(60))
    try:
        yield beat
    finally:
        beat.stop()


def test_beat_schedules_ticks_that_find_a_lost_sandbox_and_fail_it_after_the_grace(host, tmp_path):
    placed = running_on(HOST_ID)  # the host has no record of it: "unknown"
    common = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": children_database_url(),
        "HOLDFAST_CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
        "HOLDFAST_RECONCILE_INTERVAL_S": "1",
        "HOLDFAST_SANDBOX_LOSS_GRACE_S": "2",
        "HOLDFAST_SANDBOX_URL": host.url,
        "HOLDFAST_SANDBOX_TOKEN": TOKEN,
        "HOLDFAST_RUNS_LAUNCH_DRIVER": "",
    }
    with start_worker(common, concurrency=2) as worker, start_beat(common, tmp_path / "beat-schedule"):
        stamped = wait_until(
            lambda: Run.objects.get(pk=placed.run_id).loss_observed_at, timeout=30, what="the first tick's stamp"
        )
        failed = wait_until(
            lambda: Run.objects.filter(pk=placed.run_id, status=RunStatus.FAILED).first(),
            timeout=30,
            what="a later tick to fail it",
        )
    assert failed.error.startswith("sandbox_lost") and failed.key_revoked_at is not None
    assert (failed.finished_at - stamped).total_seconds() >= 2.0
    ticks = [line for line in worker.lines if "event=reconcile_tick" in line]
    assert len(ticks) >= 2, worker.output()[-3000:]
