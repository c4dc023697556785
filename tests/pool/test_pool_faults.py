"""The pool under faults found in review: each test names a way a worker could hang,
spin or fail work it should have finished, against real host processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

import pytest

from controlplane.pool import outcome as texts
from controlplane.pool.pool import SandboxPool
from tests.pool.test_pool import BASE, request
from tests.support.host import start_host
from tests.timing import scaled, wait_until

pytestmark = pytest.mark.peer


def run_in_thread(pool: SandboxPool, req, **kwargs):
    box: list = []
    thread = threading.Thread(target=lambda: box.append(pool.run(req, **kwargs)), daemon=True)
    thread.start()
    return thread, box


def authenticated_connections(host) -> int:
    return sum(1 for line in host.log_lines if "connection_authenticated" in line)


def test_an_operator_drained_only_host_fails_at_the_deadline_instead_of_spinning(sandbox_token):
    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token, acquire_timeout_s=2.0))
        pool.set_draining(host_ids={host.host_id})
        try:
            thread, box = run_in_thread(pool, request("print(1)"))
            thread.join(scaled(30))
            assert not thread.is_alive(), "the pool kept reconnecting past its acquire timeout"
        finally:
            pool.close()
        # Backing off between attempts: a handful of connections, not thousands.
        assert authenticated_connections(host) < 40
    assert box[0].status == "failed"
    assert "draining" in box[0].error


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", " , ", "ws://"])
def test_an_unusable_url_is_a_configuration_error_every_time(url):
    pool = SandboxPool(replace(BASE, url=url, token="t", acquire_timeout_s=0.5))
    for _ in range(2):  # the second call must not find a pool wedged by the first
        result = pool.run(request("print(1)"))
        assert result.status == "failed"
        assert result.error.startswith("The sandbox pool is not configured")


def test_code_too_large_once_encoded_is_refused_and_spares_its_neighbours(sandbox_token):
    # 200 KB of control characters: under the byte limit on the way in, six times that
    # once JSON-escaped. Sent, it would make the host drop the shared connection.
    big = "x = '" + "\x01" * 200_000 + "'"
    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token))
        try:
            neighbour, box = run_in_thread(pool, request("import time; time.sleep(1.5); print('ok')"))
            wait_until(lambda: pool.snapshot() and pool.snapshot()[0].in_flight == 1, what="the neighbour")
            refused = pool.run(request(big))
            neighbour.join(scaled(30))
        finally:
            pool.close()
    assert refused.status == "failed" and refused.error.startswith("Code is too large")
    assert not refused.sent
    assert box[0].status == "succeeded"


def test_a_cancel_check_that_raises_does_not_lose_the_result(sandbox_token):
    calls = [0]

    def flaky_cancel() -> bool:
        calls[0] += 1
        if calls[0] >= 3:
            raise ConnectionError("database went away")
        return False

    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token))
        try:
            result = pool.run(request("import time; time.sleep(0.5); print('done')"), cancel=flaky_cancel)
        finally:
            pool.close()
    assert calls[0] >= 3
    assert result.status == "succeeded" and result.stdout.strip() == "done"


def test_a_frozen_host_cannot_hold_callers_past_their_deadlines(sandbox_token):
    """SIGSTOP: the host accepts bytes into its kernel buffers, then reads nothing. Large
    frames fill the buffers; without send deadlines the callers would block for good."""
    big = "x = '" + "a" * 900_000 + "'"
    with start_host(sandbox_token) as host:
        pool = SandboxPool(
            replace(BASE, url=host.url, token=sandbox_token, acquire_timeout_s=3.0, connect_timeout_s=2.0)
        )
        try:
            assert pool.run(request("print(1)")).status == "succeeded"
            os.kill(host.pid, signal.SIGSTOP)
            runs = [run_in_thread(pool, request(big, timeout_s=1.0)) for _ in range(12)]
            for thread, _ in runs:
                thread.join(scaled(60))
            stuck = sum(thread.is_alive() for thread, _ in runs)
        finally:
            os.kill(host.pid, signal.SIGCONT)
            pool.close()
    assert stuck == 0
    assert {box[0].status for _, box in runs} <= {"failed", "timed_out", "interrupted"}


def test_a_stuck_housekeeping_hook_does_not_stop_connections_retiring(sandbox_token):
    release = threading.Event()

    def stuck_hook(pool) -> None:
        release.wait()

    with start_host(sandbox_token) as host:
        pool = SandboxPool(
            replace(BASE, url=host.url, token=sandbox_token, max_connections=1, max_age_s=1.0, max_age_jitter=0.0)
        )
        pool.add_housekeeping_hook(stuck_hook)
        try:
            assert pool.run(request("print(1)")).status == "succeeded"
            time.sleep(1.5)  # the only connection is now past its max age
            result = pool.run(request("print(2)"))
        finally:
            release.set()
            pool.close()
    assert result.status == "succeeded"


def test_closing_a_connection_to_a_frozen_host_ends_its_reader(sandbox_token):
    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token))
        try:
            assert pool.run(request("print(1)")).status == "succeeded"
            conn = pool._connections[0]
            os.kill(host.pid, signal.SIGSTOP)
            conn.close("test: retire while the host is frozen")
            wait_until(lambda: not conn._reader.is_alive(), timeout=15, what="the reader thread to end")
        finally:
            os.kill(host.pid, signal.SIGCONT)
            pool.close()


def test_a_host_at_capacity_is_waited_for_not_given_up_on(sandbox_token):
    with start_host(sandbox_token, extra_args=("--max-concurrent", "1")) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token))
        try:
            first, box = run_in_thread(pool, request("import time; time.sleep(1.5); print('first')"))
            wait_until(lambda: pool.snapshot() and pool.snapshot()[0].in_flight == 1, what="the first")
            second = pool.run(request("print('second')"))
            first.join(scaled(30))
        finally:
            pool.close()
    assert box[0].status == "succeeded"
    assert second.status == "succeeded", second.error
    assert second.error != texts.NOT_PLACED.format(moves=3)
