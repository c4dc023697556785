"""execute() is woken by its result's notification (PostgreSQL NOTIFY after the result
commits), reads the row then, and still finds a result whose notification never came
through its safety-net poll (issue 12, "results pushed, not polled")."""

from __future__ import annotations

import pytest

from controlplane.executions import api, notify
from tests.support.host import start_host
from tests.support.worker import start_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.peer, pytest.mark.usefixtures("owners")]


def _env(host, token: str, **extra: str) -> dict[str, str]:
    return {"HOLDFAST_SANDBOX_URL": host.url, "HOLDFAST_SANDBOX_TOKEN": token, **extra}


def test_execute_returns_when_the_result_is_announced(sandbox_token):
    with start_host(sandbox_token) as host, start_worker(_env(host, sandbox_token)):
        api.execute("print('warm')", owner="push-test", timeout_s=10)  # the worker's pool connects
        received = notify.listener().notifications
        result = api.execute("print(6 * 7)", owner="push-test", timeout_s=10)
    assert (result.status, result.stdout) == ("succeeded", "42\n")
    assert api.stats.last_woken_by_notification
    assert notify.listener().notifications > received
    # Listening before the row existed, it reads once, after the notification: no
    # polling, and no read of a row that cannot have a result yet.
    assert api.stats.reads == 1


def test_a_result_whose_notification_never_comes_is_found_by_the_safety_net(sandbox_token):
    # The worker stores results without announcing them: the caller must still return.
    with start_host(sandbox_token) as host:
        env = _env(host, sandbox_token, HOLDFAST_EXECUTION_RESULT_NOTIFY="0")
        with start_worker(env):
            result = api.execute("print('quietly')", owner="push-test", timeout_s=10)
    assert (result.status, result.stdout) == ("succeeded", "quietly\n")
    assert not api.stats.last_woken_by_notification


def test_the_statement_that_stores_a_result_announces_it_only_when_announcing_is_on(settings):
    import psycopg

    from controlplane import pgnotify
    from controlplane.executions import actions, dispatch
    from controlplane.pool.outcome import Outcome

    def running() -> str:
        actions.create("print(1)", owner="push-test", timeout_s=5, memory_mb=64)
        return dispatch.claim_next("test").id

    done = Outcome("succeeded", exit_code=0, stdout="1\n", duration_ms=1, host_id="h")
    with psycopg.connect(autocommit=True, **pgnotify.connect_params()) as listening:
        listening.execute(f"LISTEN {notify.CHANNEL}")
        announced = running()
        assert actions.finish(announced, done)
        assert [n.payload for n in listening.notifies(timeout=5, stop_after=1)] == [announced]
        settings.EXECUTION_RESULT_NOTIFY = False
        quiet = running()
        assert actions.finish(quiet, done)
        assert [n.payload for n in listening.notifies(timeout=1)] == []
