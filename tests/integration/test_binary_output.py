"""End to end: a run whose job prints NUL and invalid UTF-8 still succeeds with its
output recorded (each NUL and each invalid sequence becomes U+FFFD, as documented),
instead of the events API refusing the batch and the run failing."""

from __future__ import annotations

import pytest

from controlplane.runs import actions
from controlplane.runs.dispatch import enqueue_launch_on_commit
from controlplane.runs.models import Run, RunStatus
from tests.timing import wait_until

from .conftest import launching_worker, stdout_lines
from .support import run_log, start_web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.peer]

JOB = "import sys\nsys.stdout.buffer.write(b'a\\x00b\\xffc\\n')\nprint('after')\n"


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup):
    with start_web(tmp_path_factory.mktemp("web")) as process:
        yield process


def test_nul_and_invalid_utf8_in_a_job_s_output_are_recorded(host, web, state_dir):
    with launching_worker(host, web.url):
        run = actions.create_run("binary-test", {"kind": "python", "source": JOB, "timeout_s": 60})
        enqueue_launch_on_commit(run.id)
        run = wait_until(lambda: (r := Run.objects.get(pk=run.id)).is_terminal and r, timeout=90, what="the run")
    assert run.status == RunStatus.SUCCEEDED, (run.error, run_log(state_dir, run.id))
    assert stdout_lines(run.id) == ["a\ufffdb\ufffdc", "after"]
