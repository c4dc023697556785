"""Fixtures for the end-to-end run tests: a real sandbox host (whose run sandboxes are
killed when the module ends: they are detached and would outlive it), a real web
process, a real Celery worker launching through the real WebSocket driver."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from controlplane.runs.models import Run, RunEvent
from tests.support.host import HostProcess, start_host
from tests.support.owners import use_in_database_tests
from tests.support.worker import WorkerProcess, start_worker

from .support import stop_runs

TOKEN = "hf-integ-" + secrets.token_hex(16)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("host-state")


@pytest.fixture(scope="module")
def host(state_dir) -> Iterator[HostProcess]:
    try:
        with start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as running:
            yield running
    finally:
        stop_runs(state_dir)


@contextlib.contextmanager
def launching_worker(host: HostProcess, control_plane_url: str) -> Iterator[WorkerProcess]:
    """A worker whose runs launch on ``host`` through the default WebSocket driver and
    whose runners call ``control_plane_url``."""
    env = {
        "HOLDFAST_CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
        "HOLDFAST_SANDBOX_URL": host.url,
        "HOLDFAST_SANDBOX_TOKEN": TOKEN,
        "HOLDFAST_RUNS_LAUNCH_DRIVER": "",
        "HOLDFAST_CONTROL_PLANE_URL": control_plane_url,
        "HOLDFAST_RUNS_LAUNCH_RETRY_DELAY_S": "1",
    }
    with start_worker(env, concurrency=2) as worker:
        yield worker


def counting_job(lines: int, interval_s: float = 0.5) -> str:
    """A Python job printing ``line 1`` .. ``line N``, one every ``interval_s``."""
    return (
        "import time\n"
        f"for i in range(1, {lines} + 1):\n"
        "    print(f'line {i}', flush=True)\n"
        f"    time.sleep({interval_s})\n"
    )


def stdout_lines(run_id: object) -> list[str]:
    return [e.data.get("line", "") for e in RunEvent.objects.filter(run_id=run_id, type="stdout").order_by("seq")]


def assert_events_exactly_once(run: Run, lines: int) -> list[int]:
    """Every line the job printed is recorded once, in order; seqs are 1..M without gaps,
    the last one the control plane's ``result``. Returns the seqs."""
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)), f"seqs have gaps or repeats: {seqs}"
    assert stdout_lines(run.id) == [f"line {i}" for i in range(1, lines + 1)]
    assert RunEvent.objects.filter(run=run, type="result").count() == 1
    assert RunEvent.objects.filter(run=run).last().type == "result"
    return seqs


@pytest.fixture(autouse=True)
def _suite_owners(request):
    """Every test here may create runs for the suite's owners (tests/support/owners.py)."""
    use_in_database_tests(request)
