"""The wire encrypted: a host started with ``--tls-cert``/``--tls-key`` speaks wss://
only; the worker's pool and the launch driver dial it and verify its certificate against
HOLDFAST_SANDBOX_CA_BUNDLE. The CA and certificates are made here (trustme)."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
import trustme
import websocket
from django.test import override_settings

from controlplane.pool.outcome import ExecRequest
from controlplane.pool.pool import SandboxPool
from controlplane.runs.host_driver import WebSocketLaunchDriver
from controlplane.runs.launcher import LaunchRequest, LaunchUnavailable
from holdfast_wire import protocol
from tests.integration.support import stop_runs
from tests.pool.test_pool import BASE
from tests.support.host import start_host
from tests.timing import scaled

pytestmark = pytest.mark.peer


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_host(ca, tmp_path, sandbox_token):
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = tmp_path / "host.pem", tmp_path / "host.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    args = ("--tls-cert", str(chain), "--tls-key", str(key), "--state-dir", str(tmp_path / "state"))
    with start_host(sandbox_token, extra_args=args) as host:
        yield host
    stop_runs(tmp_path / "state")


@pytest.fixture
def ca_bundle(ca, tmp_path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def run(url: str, token: str) -> object:
    pool = SandboxPool(replace(BASE, url=url, token=token, acquire_timeout_s=scaled(5)))
    try:
        request = ExecRequest(id=uuid.uuid4().hex, code="print('over tls')", timeout_ms=10_000, memory_mb=256)
        return pool.run(request)
    finally:
        pool.close()


def test_the_pool_runs_an_execution_over_wss_verified_by_the_ca_bundle(tls_host, ca_bundle, sandbox_token):
    assert tls_host.url.startswith("wss://127.0.0.1:")
    with override_settings(SANDBOX_CA_BUNDLE=ca_bundle):
        outcome = run(tls_host.url, sandbox_token)
    assert (outcome.status, outcome.stdout) == ("succeeded", "over tls\n")


def test_a_host_certificate_from_an_unknown_ca_is_refused(tls_host, sandbox_token, tmp_path):
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    with override_settings(SANDBOX_CA_BUNDLE=str(other)):
        outcome = run(tls_host.url, sandbox_token)
    assert outcome.status != "succeeded"
    assert "SSL" in outcome.error or "certificate" in outcome.error.lower()
    # Nothing authenticated: the token never crossed to a host we could not verify.
    assert "connection_authenticated" not in tls_host.log()


def test_a_cleartext_client_gets_nothing_from_a_tls_host(tls_host, sandbox_token):
    with pytest.raises((websocket.WebSocketException, OSError)):
        ws = websocket.create_connection(tls_host.url.replace("wss://", "ws://"), timeout=scaled(5))
        ws.send(protocol.encode(protocol.Auth(token=sandbox_token, client="cleartext")))
        ws.recv()
    assert "connection_authenticated" not in tls_host.log()


def test_the_launch_driver_launches_over_wss(tls_host, ca_bundle, sandbox_token):
    request = LaunchRequest(str(uuid.uuid4()), "hfl_" + uuid.uuid4().hex, "http://127.0.0.1:9")

    def driver() -> WebSocketLaunchDriver:
        return WebSocketLaunchDriver(
            urls=(tls_host.url,), token=sandbox_token, connect_timeout_s=scaled(5), reply_timeout_s=scaled(10)
        )

    with override_settings(SANDBOX_CA_BUNDLE=""):  # the system's CAs do not know ours
        with pytest.raises(LaunchUnavailable):
            driver().launch(request)
    with override_settings(SANDBOX_CA_BUNDLE=ca_bundle):
        ack = driver().launch(request)
    assert ack.host_id == tls_host.host_id and not ack.already_launched


def test_concurrent_executions_share_one_wss_connection(tls_host, ca_bundle, sandbox_token):
    """Results written by execution threads while the reader waits on the same TLS
    connection: every one arrives intact."""
    import threading

    pool = SandboxPool(replace(BASE, url=tls_host.url, token=sandbox_token, max_connections=1))
    outcomes: list[object] = []

    def one(i: int) -> None:
        code = f"import time\ntime.sleep(0.2)\nprint('n{i}' * 1000)"
        outcomes.append(pool.run(ExecRequest(id=uuid.uuid4().hex, code=code, timeout_ms=20_000, memory_mb=256)))

    try:
        with override_settings(SANDBOX_CA_BUNDLE=ca_bundle):
            threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(scaled(60))
    finally:
        pool.close()
    assert sorted(o.stdout for o in outcomes) == sorted(f"{'n' + str(i)}" * 1000 + "\n" for i in range(8))
    assert {o.status for o in outcomes} == {"succeeded"}
