"""The pool's listener hook against a real host: typed snapshots of every state change,
the way the drain page's publisher learns of them (never from the logs)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.pool.pool import SandboxPool
from controlplane.pool.state import ConnectionSnapshot, ConnState, PoolListener, RetireReason
from tests.pool.test_pool import BASE, request
from tests.support.host import start_host
from tests.timing import wait_until

pytestmark = pytest.mark.peer


class Recorder(PoolListener):
    def __init__(self) -> None:
        self.seen: list[tuple[str, ConnectionSnapshot]] = []

    def connection_opened(self, conn: ConnectionSnapshot) -> None:
        self.seen.append(("opened", conn))

    def connection_retiring(self, conn: ConnectionSnapshot) -> None:
        self.seen.append(("retiring", conn))

    def connection_closed(self, conn: ConnectionSnapshot) -> None:
        self.seen.append(("closed", conn))


class Broken(PoolListener):
    def connection_opened(self, conn: ConnectionSnapshot) -> None:
        raise RuntimeError("a listener bug")


def test_a_listener_hears_open_retire_and_close_with_typed_state_and_reason(sandbox_token):
    with start_host(sandbox_token, host_id="heard") as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token))
        recorder = Recorder()
        pool.add_listener(Broken())  # a failing listener is logged and skipped
        pool.add_listener(recorder)
        try:
            assert pool.run(request("print(1)")).status == "succeeded"
            assert pool.retire_host("heard") == 1
            wait_until(lambda: [kind for kind, _ in recorder.seen] == ["opened", "retiring", "closed"], timeout=5)
        finally:
            pool.close()
    opened, retiring, closed = (conn for _, conn in recorder.seen)
    assert (opened.host_id, opened.state, opened.retire_reason) == ("heard", ConnState.OPEN, None)
    assert (retiring.state, retiring.retire_reason) == (ConnState.RETIRING, RetireReason.OPERATOR_DRAIN)
    assert (closed.state, closed.finished) == (ConnState.CLOSED, 1)
    assert closed.as_dict()["retire_reason"] == "operator drain"


def test_a_host_that_drains_is_heard_as_host_draining(sandbox_token):
    with start_host(sandbox_token, host_id="leaving", extra_args=("--drain-grace-s", "30")) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token))
        recorder = Recorder()
        pool.add_listener(recorder)
        try:
            assert pool.run(request("print(1)")).status == "succeeded"
            host.terminate()
            wait_until(lambda: any(kind == "retiring" for kind, _ in recorder.seen), timeout=10)
        finally:
            pool.close()
    [retiring] = [conn for kind, conn in recorder.seen if kind == "retiring"]
    assert (retiring.host_id, retiring.retire_reason) == ("leaving", RetireReason.HOST_DRAINING)
