"""A worker's warm shutdown (SIGTERM, what a deploy or scale-in sends) finishes the
executions it is running and records them; work still queued is left for the next
worker, and nothing runs twice."""

from __future__ import annotations

import pytest

from tests.support.host import SHARED_LEVEL, share, start_host
from tests.support.worker import start_worker
from tests.timing import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.peer,
    pytest.mark.usefixtures("owners"),
]


def test_sigterm_on_a_worker_finishes_in_flight_executions_and_hands_over_the_rest(sandbox_token, shared_dir):
    from controlplane.executions.api import submit
    from controlplane.executions.models import Execution

    marker = shared_dir / "ran.txt"
    marker.touch()
    marker.chmod(0o666)  # each execution slot runs under its own uid
    code = f"import time\nopen({str(marker)!r}, 'a').write('ran\\n')\ntime.sleep(3)\nprint('finished')\n"
    with start_host(sandbox_token, extra_args=share(shared_dir)) as host:
        env = {
            "HOLDFAST_SANDBOX_URL": host.url,
            "HOLDFAST_SANDBOX_TOKEN": sandbox_token,
            "HOLDFAST_REQUIRED_ISOLATION": SHARED_LEVEL,
        }
        with start_worker(env, concurrency=2) as old_worker:
            ids = [str(submit(code, owner="restart-test", timeout_s=30)) for _ in range(4)]
            wait_until(
                lambda: Execution.objects.filter(pk__in=ids, status="running").count() == 2,
                timeout=30,
                what="two executions running",
            )
            old_worker.stop()  # SIGTERM: warm shutdown
            assert old_worker.popen.returncode == 0
            finished_by_old = set(Execution.objects.filter(pk__in=ids, status="succeeded").values_list("pk", flat=True))
        assert len(finished_by_old) == 2
        with start_worker(env, concurrency=2):
            wait_until(
                lambda: Execution.objects.filter(pk__in=ids, status="succeeded").count() == 4,
                timeout=60,
                what="the new worker to run the rest",
            )
    rows = Execution.objects.filter(pk__in=ids)
    assert {r.status for r in rows} == {"succeeded"}
    assert all(r.stdout.strip() == "finished" for r in rows)
    assert marker.read_text().count("ran") == 4  # each exactly once
