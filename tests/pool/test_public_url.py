"""A host address may carry a query or credentials; what the pool logs and publishes
(its connection snapshots reach the cache, the drain page and the host registry) names
only scheme, host and port."""

from __future__ import annotations

import logging

import pytest

from controlplane.pool.connection import HostConnection
from holdfast_wire.logfmt import LogfmtFormatter
from tests.support.host import start_host

SECRET_URL = "ws://operator:hunter2@127.0.0.1:9/hosts?token=hunter3"


def test_a_connection_snapshot_names_only_scheme_host_and_port() -> None:
    conn = HostConnection(SECRET_URL, max_age_s=60, limit=4, on_change=lambda: None)
    assert conn.snapshot().url == "ws://127.0.0.1:9"


@pytest.mark.peer
def test_the_opened_connection_is_logged_without_credentials_or_query(caplog) -> None:
    token = "hf-public-url-" + "0123456789abcdef" * 2
    with start_host(token) as host:
        url = host.url.replace("ws://", "ws://operator:hunter2@") + "/?token=hunter3"
        conn = HostConnection(url, max_age_s=60, limit=4, on_change=lambda: None)
        with caplog.at_level(logging.INFO):
            conn.connect(token, timeout_s=10, client="test")
        conn.close("test over")
    lines = [LogfmtFormatter().format(record) for record in caplog.records]  # the fields, as written
    assert any("connection_opened" in line for line in lines) and not any("hunter" in line for line in lines)
