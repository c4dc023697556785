"""execute() is woken by its result's notification (PostgreSQL NOTIFY after the result
commits), takes the result the notification carries or reads the row, and still finds
a result whose notification never came through its safety-net poll (issue 12, "results
pushed, not polled")."""

from __future__ import annotations

import json

import pytest

from controlplane.executions import api, fields, notify
from controlplane.executions.models import Execution
from tests.support.host import start_host
from tests.support.worker import start_worker
from tests.timing import wait_until

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


def _running() -> str:
    from controlplane.executions import actions, dispatch

    actions.create("print(1)", owner="push-test", timeout_s=5, memory_mb=64)
    return dispatch.claim_next("test").id


def _finish(execution_id: str, stdout: str) -> None:
    from controlplane.executions import actions
    from controlplane.pool.outcome import Outcome

    assert actions.finish(execution_id, Outcome("succeeded", exit_code=0, stdout=stdout, duration_ms=1, host_id="h"))


def test_the_statement_that_stores_a_result_announces_it_only_when_announcing_is_on(settings):
    import psycopg

    from controlplane import pgnotify

    with psycopg.connect(autocommit=True, **pgnotify.connect_params()) as listening:
        listening.execute(f"LISTEN {notify.CHANNEL}; LISTEN {notify.RESULT_CHANNEL}")
        announced = _running()
        _finish(announced, "1\n")
        heard = [(n.channel, n.payload) for n in listening.notifies(timeout=5, stop_after=2)]
        # The result as the statement stored it first, then the id alone on the channel
        # a process of the release before listens on (it takes the payload as the id).
        [(channel, payload), later] = heard
        assert later == (notify.CHANNEL, announced)
        execution_id, _, carried = payload.partition(" ")
        assert (channel, execution_id) == (notify.RESULT_CHANNEL, announced)
        stored = api._result(Execution.objects.get(pk=announced))
        assert api.ExecutionResult(id=announced, **json.loads(carried)) == stored
        assert stored.stdout == "1\n"
        # Over the size in bytes, not in characters: the id alone.
        large = _running()
        _finish(large, "\u20ac" * (notify.ANNOUNCED_MAX_BYTES // 3 + 1))
        assert [(n.channel, n.payload) for n in listening.notifies(timeout=5, stop_after=1)] == [
            (notify.CHANNEL, large)
        ]
        settings.EXECUTION_RESULT_NOTIFY = False
        _finish(_running(), "1\n")
        assert [n.payload for n in listening.notifies(timeout=1)] == []


@pytest.mark.parametrize(
    "stdout",
    ["a\x00b\n", fields.ENCODED_PREFIX + "looks encoded\n", '\u00e9 \u2028 "quoted" \\ \t\x01\n'],
    ids=["nul", "prefix", "escapes"],
)
def test_a_carried_result_is_the_one_the_row_gives_back(stdout):
    # Output PostgreSQL cannot hold as text is stored encoded (fields.py): the caller
    # must get it back as the row gives it, not as it is stored.
    listener = notify.Listener()
    try:
        assert listener.ready(10)
        execution_id = _running()
        woken = listener.register(execution_id)
        _finish(execution_id, stdout)
        assert woken.wait(10)
        result = api._wait(execution_id, woken, cancel=None, wait_s=5, pickup_wait_s=None)
    finally:
        listener.stop()
    assert api.stats.reads == 0
    assert result == api._result(Execution.objects.get(pk=execution_id))
    assert result.stdout == stdout


def test_the_id_alone_after_a_carried_result_keeps_it():
    from controlplane import pgnotify

    listener = notify.Listener()
    try:
        assert listener.ready(10)
        execution_id = _running()
        woken = listener.register(execution_id)
        _finish(execution_id, "1\n")
        pgnotify.send(notify.CHANNEL, execution_id)  # a sweep's or a cancel's announcement
        wait_until(lambda: listener.notifications >= 3, timeout=10, what="three announcements")
    finally:
        listener.stop()
    assert woken.result is not None and woken.result["stdout"] == "1\n"


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
        pgnotify.send(notify.RESULT_CHANNEL, f"{row.pk} {carried}")
        assert woken.wait(10)
        result = api._wait(row.pk, woken, cancel=None, wait_s=5, pickup_wait_s=None)
    finally:
        listener.stop()
    assert (result.status, result.stderr) == ("failed", "stored")
    assert api.stats.reads == 1
