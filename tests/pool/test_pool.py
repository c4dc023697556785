"""The sandbox pool against real host processes on loopback ports."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from dataclasses import replace

import pytest

from controlplane.pool import outcome as texts
from controlplane.pool.outcome import ExecRequest
from controlplane.pool.pool import PoolConfig, SandboxPool
from tests.support.host import SHARED_LEVEL, share, start_host
from tests.timing import scaled, wait_until

pytestmark = pytest.mark.peer

BASE = PoolConfig(
    url="",
    token="",
    max_age_s=120.0,
    max_age_jitter=0.2,
    per_connection_limit=8,
    max_connections=4,
    acquire_timeout_s=10.0,
    connect_timeout_s=5.0,
    max_moves=3,
    result_grace_s=5.0,
)


def request(code: str, *, timeout_s: float = 10.0) -> ExecRequest:
    return ExecRequest(id=uuid.uuid4().hex, code=code, timeout_ms=int(timeout_s * 1000), memory_mb=256)


def ran_count(marker) -> int:
    return marker.read_text().count("ran") if marker.exists() else 0


class CountingListener:
    """A TCP listener that only counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.sock.getsockname()[1]}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_pre_cancelled_call_returns_cancelled_without_touching_the_network():
    listener = CountingListener()
    try:
        pool = SandboxPool(replace(BASE, url=listener.url, token="t"))
        result = pool.run(request("print(1)"), cancel=lambda: True)
        time.sleep(0.2)
        assert result.status == "cancelled"
        assert result.error == texts.CANCELLED
        assert listener.accepted == 0
        assert pool.snapshot() == []
    finally:
        listener.close()


def test_pre_cancelled_call_wins_over_a_missing_configuration():
    """The cancel is checked before anything else, settings included."""
    pool = SandboxPool(replace(BASE, url="", token=""))
    result = pool.run(request("print(1)"), cancel=lambda: True)
    assert result.status == "cancelled"


def test_pre_cancelled_execute_returns_without_touching_the_database():
    """No django_db mark: any query here would raise, so this proves none is made."""
    from controlplane.executions import execute

    cancelled = threading.Event()
    cancelled.set()
    result = execute("print(1)", owner="t", cancel=cancelled)
    assert result.status == "cancelled"
    assert result.id is None


@pytest.mark.parametrize(
    ("url", "token", "missing"), [("", "t", "HOLDFAST_SANDBOX_URL"), ("ws://x", "", "HOLDFAST_SANDBOX_TOKEN")]
)
def test_unconfigured_pool_fails_at_once_with_a_configuration_error(url, token, missing):
    pool = SandboxPool(replace(BASE, url=url, token=token))
    result = pool.run(request("print(1)"))
    assert result.status == "failed"
    assert result.error == texts.MISCONFIGURED.format(missing=missing)
    assert not result.sent


def test_runs_a_snippet_and_shares_one_connection(sandbox_token):
    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token))
        try:
            results = []
            threads = [
                threading.Thread(target=lambda i=i: results.append(pool.run(request(f"print({i} * 2)"))))
                for i in range(4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(r.stdout.strip() for r in results) == ["0", "2", "4", "6"]
            assert all(r.status == "succeeded" and r.host_id == host.host_id for r in results)
            assert len(pool.snapshot()) == 1
        finally:
            pool.close()


def test_user_exception_is_a_failed_execution_with_its_traceback(sandbox_token):
    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token))
        try:
            result = pool.run(request("raise KeyError('nope')"))
        finally:
            pool.close()
    assert result.status == "failed"
    assert result.exit_code == 1
    assert "KeyError: 'nope'" in result.stderr
    assert "Traceback" in result.stderr


def test_wrong_token_is_a_clear_connect_error(sandbox_token):
    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token="wrong-" + sandbox_token, acquire_timeout_s=0.5))
        result = pool.run(request("print(1)"))
    assert result.status == "failed"
    assert result.error.startswith("Could not reach a sandbox host")
    assert sandbox_token not in result.error


def test_execution_dispatched_onto_a_closing_connection_completes_on_a_new_one(sandbox_token, shared_dir):
    """Interleaving fake: the connection closes between being chosen and being used,
    the window a max-age retirement or a host close can hit."""
    marker = shared_dir / "ran.txt"
    with start_host(sandbox_token, extra_args=share(shared_dir)) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token, required_isolation=SHARED_LEVEL))
        real_acquire = pool._acquire
        closed = []

        def acquire_then_close(deadline, cancel, **kwargs):
            conn = real_acquire(deadline, cancel, **kwargs)
            if not closed:
                conn.close("test: closing before dispatch")
                closed.append(conn)
            return conn

        pool._acquire = acquire_then_close
        try:
            result = pool.run(request(f"open({str(marker)!r}, 'a').write('ran\\n'); print('ok')"))
        finally:
            pool.close()
    assert result.status == "succeeded", result
    assert result.attempts == 2
    assert ran_count(marker) == 1


def test_execution_whose_host_is_killed_mid_run_is_interrupted_and_not_rerun(sandbox_token, shared_dir):
    marker = shared_dir / "ran.txt"
    code = f"import time\nopen({str(marker)!r}, 'a').write('ran\\n')\ntime.sleep(30)\n"
    with start_host(sandbox_token, extra_args=share(shared_dir)) as host:
        pool = SandboxPool(
            replace(BASE, url=host.url, token=sandbox_token, acquire_timeout_s=2.0, required_isolation=SHARED_LEVEL)
        )
        results = []
        runner = threading.Thread(target=lambda: results.append(pool.run(request(code, timeout_s=60))))
        runner.start()
        wait_until(lambda: ran_count(marker) == 1, timeout=20, what="the snippet to start")
        host.kill()
        runner.join(timeout=scaled(30))
        pool.close()
    assert results and results[0].status == "interrupted"
    assert results[0].error == texts.INTERRUPTED
    time.sleep(scaled(1))
    assert ran_count(marker) == 1


def test_connection_retires_at_max_age_after_finishing_its_work(sandbox_token):
    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token, max_age_s=1.0, max_age_jitter=0.0))
        try:
            long_run = []
            t = threading.Thread(
                target=lambda: long_run.append(pool.run(request("import time; time.sleep(2.5); print('done')")))
            )
            t.start()
            wait_until(lambda: pool.snapshot(), timeout=10, what="a connection")
            wait_until(lambda: pool.snapshot() and pool.snapshot()[0].state == "retiring", timeout=5, what="retirement")
            # A retiring connection takes no new work: this one opens a second connection.
            quick = pool.run(request("print('quick')"))
            assert quick.status == "succeeded"
            t.join()
            assert long_run[0].status == "succeeded" and long_run[0].stdout.strip() == "done"
            wait_until(lambda: all(c.state != "retiring" for c in pool.snapshot()), timeout=5, what="close")
        finally:
            pool.close()


def test_work_a_draining_host_refuses_moves_to_another_host(sandbox_token, shared_dir):
    """Interleaving fake: the connection ignores the host's draining frame, so the next
    execution really reaches the draining host, which must answer not_started; the
    pool must move it (it never ran) and it runs exactly once, on the new host."""
    from holdfast_devtools.balancer import TcpBalancer

    marker = shared_dir / "ran.txt"
    shared = share(shared_dir)
    with (
        start_host(sandbox_token, host_id="old", extra_args=shared) as old,
        start_host(sandbox_token, host_id="new", extra_args=shared) as new,
    ):
        with TcpBalancer() as balancer:
            balancer.add_target("old", ("127.0.0.1", old.port))
            url = f"ws://127.0.0.1:{balancer.address[1]}"
            pool = SandboxPool(replace(BASE, url=url, token=sandbox_token, required_isolation=SHARED_LEVEL))
            try:
                held = []
                t = threading.Thread(
                    target=lambda: held.append(pool.run(request("import time; time.sleep(2); print('held')")))
                )
                t.start()
                wait_until(lambda: pool.snapshot() and pool.snapshot()[0].in_flight == 1, what="in flight")
                conn = pool._connections[0]
                real_retire = conn.retire
                conn.retire = lambda reason: None if reason == "host draining" else real_retire(reason)
                balancer.add_target("new", ("127.0.0.1", new.port))
                balancer.deregister("old")
                old.terminate()  # SIGTERM: draining, in-flight work finishes
                wait_until(lambda: "draining_started" in old.log(), timeout=10, what="the old host to drain")
                result = pool.run(request(f"open({str(marker)!r}, 'a').write('ran\\n'); print('moved')"))
                t.join()
            finally:
                pool.close()
    assert held[0].status == "succeeded" and held[0].host_id == "old"
    assert result.status == "succeeded" and result.host_id == "new"
    assert result.attempts == 2
    assert ran_count(marker) == 1


def test_idle_connection_closes_at_max_age(sandbox_token):
    with start_host(sandbox_token) as host:
        pool = SandboxPool(replace(BASE, url=host.url, token=sandbox_token, max_age_s=1.0, max_age_jitter=0.0))
        try:
            assert pool.run(request("print(1)")).status == "succeeded"
            wait_until(lambda: pool.snapshot() == [] or pool.snapshot()[0].state == "closed", timeout=5)
        finally:
            pool.close()


def test_a_host_below_the_required_isolation_gets_nothing(sandbox_token, tmp_path):
    """DESIGN.md (Containment): pools refuse hosts below the required level. A host that
    was explicitly started without a sandbox is refused before anything is sent to it,
    with the reason in the error; a pool told to accept that level uses it."""
    marker = tmp_path / "ran.txt"
    code = f"open({str(marker)!r}, 'a').write('ran')"
    with start_host(sandbox_token, extra_args=("--isolation", "insecure-rlimits")) as host:
        strict = SandboxPool(replace(BASE, url=host.url, token=sandbox_token, acquire_timeout_s=0.5))
        try:
            refused = strict.run(request(code))
        finally:
            strict.close()
        assert refused.status == "failed" and not refused.sent
        assert "isolation is insecure-rlimits, below the required bwrap" in refused.error
        assert not marker.exists()
        lenient = SandboxPool(replace(BASE, url=host.url, token=sandbox_token, required_isolation="insecure-rlimits"))
        try:
            assert lenient.run(request("print('ok')")).stdout == "ok\n"
            assert [c.isolation for c in lenient.snapshot()] == ["insecure-rlimits"]
        finally:
            lenient.close()
