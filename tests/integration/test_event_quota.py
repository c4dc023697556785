"""End to end: a run whose job prints more lines than its event quota keeps running to
its own verdict; the runner stops sending at ``409 events_truncated`` and says so once;
the run holds the quota's events and one ``events_truncated`` event."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from controlplane.runs import actions
from controlplane.runs.dispatch import enqueue_launch_on_commit
from controlplane.runs.models import Run, RunEvent, RunStatus
from tests.timing import wait_until

from .conftest import counting_job, launching_worker
from .support import run_log, start_web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.peer]

QUOTA = 20
LINES = 120


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup):
    with mock.patch.dict(os.environ, {"HOLDFAST_RUNS_MAX_EVENTS_PER_RUN": str(QUOTA)}):
        with start_web(tmp_path_factory.mktemp("web")) as process:
            yield process


def test_a_job_past_its_event_quota_finishes_with_its_own_verdict(host, web, state_dir):
    with launching_worker(host, web.url):
        run = actions.create_run(
            "quota-test", {"kind": "python", "source": counting_job(LINES, 0.01), "timeout_s": 120}
        )
        enqueue_launch_on_commit(run.id)
        run = wait_until(
            lambda: (r := Run.objects.get(pk=run.id)).is_terminal and r, timeout=90, what="the run to finish"
        )
    log = run_log(state_dir, run.id)
    assert run.status == RunStatus.SUCCEEDED, (run.error, log)
    kinds = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert kinds.count("events_truncated") == 1
    assert kinds.count("stdout") <= QUOTA
    assert kinds[-1] == "result"
    assert log.count("event=events_truncated") == 1
