"""execute() is woken by its result's notification (PostgreSQL NOTIFY after the result
commits), takes the result the notification carries or reads the row, and still finds
a result whose notification never came through its safety-net poll (issue 12, "results
pushed, not polled")."""

from __future__ import annotations

import json

import pytest

from controlplane.executions import api, notify
from controlplane.executions.models import Execution
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
    # Listening before the row existed, it never reads the row: not before the
    # notification (nothing can be there yet), nor after (the notification carried the
    # result as stored).
    assert api.stats.reads == 0
    stored = Execution.objects.get(pk=result.id)
    assert result == api._result(stored)


def test_a_result_too_large_to_announce_is_read_from_the_row(sandbox_token):
    # Output beyond what a notification carries: the announcement names the id only.
    code = f"print('x' * {notify.ANNOUNCED_MAX_BYTES})"
    with start_host(sandbox_token) as host, start_worker(_env(host, sandbox_token)):
        result = api.execute(code, owner="push-test", timeout_s=10)
    assert (result.status, result.stdout) == ("succeeded", "x" * notify.ANNOUNCED_MAX_BYTES + "\n")
    assert api.stats.last_woken_by_notification
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
        [payload] = [n.payload for n in listening.notifies(timeout=5, stop_after=1)]
        # The id, then the result as the statement stored it.
        execution_id, _, carried = payload.partition(" ")
        assert execution_id == announced
        stored = api._result(Execution.objects.get(pk=announced))
        assert api.ExecutionResult(id=announced, **json.loads(carried)) == stored
        assert stored.stdout == "1\n"
        settings.EXECUTION_RESULT_NOTIFY = False
        quiet = running()
        assert actions.finish(quiet, done)
        assert [n.payload for n in listening.notifies(timeout=1)] == []


@pytest.mark.parametrize(
    "carried",
    [
        "{not json",
        json.dumps({"status": "succeeded"}),  # fields missing
        json.dumps(dict.fromkeys(notify.ANNOUNCED, None) | {"status": "running"}),  # not a result yet
    ],
)
def test_a_notification_that_carries_no_usable_result_sends_the_caller_to_the_row(carried):
    # Anything but the finish statement's JSON is only a "look now": the caller reads
    # the row, and finds there what is really stored.
    from controlplane import pgnotify
    from controlplane.executions import actions

    listener = notify.Listener()
    try:
        assert listener.ready(10)
        row = actions.create("print(1)", owner="push-test", timeout_s=5, memory_mb=64)
        Execution.objects.filter(pk=row.pk).update(status="failed", stderr="stored")
        woken = listener.register(str(row.pk))
        pgnotify.send(notify.CHANNEL, f"{row.pk} {carried}")
        assert woken.wait(10)
        result = api._wait(row.pk, woken, cancel=None, wait_s=5, pickup_wait_s=None)
    finally:
        listener.stop()
    assert (result.status, result.stderr) == ("failed", "stored")
    assert api.stats.reads == 1
