"""Issue 3, test 2: a proxy in front of the control plane answers 502/503 for 60 s (a
balancer whose backends are all failing their health checks), then forwards again. The
runner, started by a real host and launched by a real worker, rides it out: the run
succeeds with every event exactly once."""

from __future__ import annotations

import itertools
import threading

import pytest

from controlplane.runs import actions
from controlplane.runs.dispatch import enqueue_launch_on_commit
from controlplane.runs.models import Run, RunEvent, RunStatus
from controlplane.runs.receipts import verify_receipt
from tests.timing import wait_until

from .conftest import assert_events_exactly_once, counting_job, launching_worker
from .support import FORWARD, HttpProxy, run_log, start_web, wait_seconds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.apart, pytest.mark.peer]

# The outage the issue names.
OUTAGE_S = 60
LINES = 40  # 20 s of output: the job ends inside the outage, its tail and result wait it out


class Outage:
    """The proxy's decision: forward, or alternate 502 and 503 while the outage is on."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self._codes = itertools.cycle(["502", "503"])

    def __call__(self, method: str, endpoint: str) -> str:
        return next(self._codes) if self.on.is_set() else FORWARD


def test_a_proxy_answering_502_503_for_60s_delays_the_run_but_loses_and_duplicates_nothing(
    host, state_dir, tmp_path, django_db_setup, capsys
):
    outage = Outage()
    with start_web(tmp_path) as web, HttpProxy(web.port, outage) as proxy, launching_worker(host, proxy.url):
        run = actions.create_run("acme", {"kind": "python", "source": counting_job(LINES), "timeout_s": 300})
        enqueue_launch_on_commit(run.id)
        wait_until(
            lambda: RunEvent.objects.filter(run=run).count() >= 4, timeout=60, what="the run to stream a few events"
        )
        before = RunEvent.objects.filter(run=run).count()
        outage.on.set()
        wait_seconds(OUTAGE_S)
        outage.on.clear()
        wait_until(lambda: _done(run.id), timeout=120, what="the run to finish after the outage")
        run.refresh_from_db()
    log = run_log(state_dir, run.id)
    assert run.status == RunStatus.SUCCEEDED, (run.error, log)
    seqs = assert_events_exactly_once(run, LINES)
    assert verify_receipt(run.receipt).ok
    refused = proxy.count(action="502") + proxy.count(action="503")
    assert refused >= 2 and proxy.count(action="502") and proxy.count(action="503")
    retries = log.count("event=retry")
    assert retries == refused, f"every 5xx the proxy answered is one retry in the runner's log:\n{log}"
    with capsys.disabled():
        print(
            f"\n[proxy 502/503 {OUTAGE_S}s] status={run.status} events={len(seqs)} (stdout {LINES} + result) "
            f"before_outage={before} proxy_5xx={refused} runner_retries={retries} "
            f"events_posts={proxy.count('POST', 'events')} batches={run.event_batches.count()}"
        )


def _done(run_id: object) -> bool:
    return Run.objects.get(pk=run_id).is_terminal
