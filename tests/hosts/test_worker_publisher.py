"""The worker side, end to end: a real Celery worker with two real hosts it dials
directly publishes its pool's snapshot, keeps the registry fresh, applies an operator
drain (``drain_host``) at once, and notices a host that drains on SIGTERM."""

from __future__ import annotations

import io
import threading
import time

import pytest
from django.core.management import call_command

from controlplane.hosts import snapshots
from controlplane.hosts.models import DrainSource, SandboxHost, State
from tests.support.host import start_host
from tests.support.worker import start_worker
from tests.timing import scaled, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.peer,
    pytest.mark.usefixtures("owners"),
]

# Hosts run with the isolation they would use in production (probed at start-up).
HOST_ARGS: tuple[str, ...] = ()
# Max age far beyond the test: any retirement seen here is the drain's, not age's.
MAX_AGE_S = 600


def worker_env(token: str, *hosts) -> dict[str, str]:
    return {
        "HOLDFAST_SANDBOX_URL": ",".join(h.url for h in hosts),
        "HOLDFAST_SANDBOX_TOKEN": token,
        "HOLDFAST_CONNECTION_MAX_AGE_S": str(MAX_AGE_S),
        "HOLDFAST_PER_CONNECTION_LIMIT": "2",
        "HOLDFAST_HOSTS_SNAPSHOT_INTERVAL_S": "0.5",
        "HOLDFAST_HOSTS_GONE_AFTER_S": "2",
    }


def host_figures(host_id: str) -> dict:
    total = {"connections": 0, "retiring": 0, "in_flight": 0, "finished_recent": 0}
    for snap in snapshots.live_snapshots():
        item = snap["hosts"].get(host_id)
        if item:
            for key in total:
                total[key] += item[key]
    return total


class Stream:
    """Submit a snippet every ``interval`` seconds until stopped."""

    def __init__(self, seconds: float, interval: float = 0.2) -> None:
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(seconds, interval), daemon=True)

    def _run(self, seconds: float, interval: float) -> None:
        from django.db import connection

        from controlplane.executions.api import submit

        try:
            while not self._stop.is_set():
                self.ids.append(str(submit(f"import time; time.sleep({seconds}); print('ok')", owner="ops-test")))
                time.sleep(interval)
        finally:
            connection.close()

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __exit__(self, *exc) -> None:
        self.stop()

    def outcomes(self) -> dict[str, tuple[str, str, str]]:
        from controlplane.executions.models import TERMINAL, Execution

        wait_until(
            lambda: Execution.objects.filter(pk__in=self.ids, status__in=TERMINAL).count() == len(self.ids),
            timeout=60,
            what="every execution to finish",
        )
        return {
            str(r.pk): (r.status, r.host_id, r.error or f"exit={r.exit_code} stderr={r.stderr[-300:]}")
            for r in Execution.objects.filter(pk__in=self.ids)
        }


def test_drain_host_retires_connections_now_and_waits_for_in_flight_work(sandbox_token):
    with (
        start_host(sandbox_token, host_id="alpha", extra_args=HOST_ARGS) as alpha,
        start_host(sandbox_token, host_id="beta", extra_args=HOST_ARGS) as beta,
    ):
        SandboxHost.objects.create(name="alpha", address=alpha.url)
        SandboxHost.objects.create(name="beta", address=beta.url)
        with start_worker(worker_env(sandbox_token, alpha, beta)), Stream(seconds=1.0) as stream:
            wait_until(
                lambda: host_figures("alpha")["in_flight"] and host_figures("beta")["connections"],
                timeout=30,
                what="work on alpha and a connection to beta",
            )
            # The registry is written by the same publisher tick, possibly one tick later.
            wait_until(
                lambda: SandboxHost.objects.get(name="alpha").last_seen_at is not None,
                timeout=10,
                what="the worker to record alpha as seen",
            )
            out = io.StringIO()
            started = time.monotonic()
            # Max age is 600 s: only the operator drain can empty alpha within this timeout.
            call_command("drain_host", "alpha", "--timeout", str(scaled(20)), stdout=out)
            drained_in = time.monotonic() - started
            after_drain = len(stream.ids)
            time.sleep(2)
            stream.stop()  # then wait while the worker still runs, so nothing stays queued
            outcomes = stream.outcomes()
        text = out.getvalue()
        assert "alpha: empty" in text, text
        assert "\r[" in text  # the progress line is rewritten in place
        assert host_figures("alpha")["connections"] == 0
        failures = {stream.ids.index(k): v for k, v in outcomes.items() if v[0] != "succeeded"}
        assert failures == {}, [line for line in beta.log_lines if "kill" in line.lower() or "cancel" in line][:8]
        # Everything submitted after the drain finished ran on beta.
        late = [outcomes[i][1] for i in stream.ids[after_drain:]]
        assert late and set(late) == {"beta"}
        row = SandboxHost.objects.get(name="alpha")
        assert row.state in (State.DRAINING, State.GONE) and row.drained_by == DrainSource.OPERATOR
        assert drained_in < MAX_AGE_S


def test_a_host_that_gets_sigterm_shows_as_draining_then_gone(sandbox_token):
    with (
        start_host(sandbox_token, host_id="gamma", extra_args=HOST_ARGS) as gamma,
        start_host(sandbox_token, host_id="delta", extra_args=HOST_ARGS) as delta,
    ):
        with start_worker(worker_env(sandbox_token, gamma, delta)) as worker, Stream(seconds=0.5) as stream:
            # Nobody registered them: the worker does on first sight.
            wait_until(
                lambda: (
                    SandboxHost.objects.filter(name__in=["gamma", "delta"], last_seen_at__isnull=False).count() == 2
                ),
                timeout=30,
                what="both hosts registered by the worker",
            )
            assert SandboxHost.objects.get(name="gamma").state == State.ACTIVE
            gamma.terminate()
            wait_until(
                lambda: SandboxHost.objects.filter(name="gamma", state=State.DRAINING).exists(),
                timeout=15,
                what="gamma to show as draining"
                + "\n".join(line for line in worker.lines if "gamma" in line or "hook" in line or "Error" in line)[
                    -3000:
                ],
            )
            row = SandboxHost.objects.get(name="gamma")
            assert row.drained_by == DrainSource.HOST and row.drain_started_at is not None
            assert gamma.wait(scaled(30)) == 0
            wait_until(
                lambda: SandboxHost.objects.filter(name="gamma", state=State.GONE).exists(),
                timeout=20,
                what="gamma to be gone",
            )
            assert SandboxHost.objects.get(name="delta").state == State.ACTIVE
            stream.stop()
            outcomes = stream.outcomes()
        failures = {k: v for k, v in outcomes.items() if v[0] != "succeeded"}
        assert failures == {}
