"""The Procfile's host line makes a restarted host the same host: its id and state dir
come from HOLDFAST_HOST_ID and HOLDFAST_HOST_STATE_DIR (docs/operations.md). Started
here exactly as a Procfile runner does (``sh -c`` of the line), twice."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from holdfast_devtools.processes import HOST_LISTENING
from tests.integration.support import free_port
from tests.support.host import ROOT, HostProcess

pytestmark = pytest.mark.peer


def _host_line() -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith("host:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no host line in the Procfile")


def _start(env: dict[str, str]) -> HostProcess:
    host = HostProcess(
        "procfile host",
        ["/bin/sh", "-c", "exec " + _host_line().replace("python ", f"{sys.executable} ", 1)],
        {**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        HOST_LISTENING,
        split_stderr=True,
    )
    host.wait_ready(30)
    return host


def test_the_procfile_host_line_keeps_the_host_id_and_state_dir_across_a_restart(tmp_path: Path):
    state = tmp_path / "host-state"
    env = {
        "HOLDFAST_SANDBOX_TOKEN": "hf-procfile-" + os.urandom(16).hex(),
        "HOLDFAST_HOST_LISTEN": f"127.0.0.1:{free_port()}",
        "HOLDFAST_HOST_ID": "procfile-host-7",
        "HOLDFAST_HOST_STATE_DIR": str(state),
    }
    ids = []
    for _ in range(2):
        host = _start(env)
        try:
            ids.append(host.host_id)
            assert (state / "runs").is_dir()
        finally:
            assert host.stop() == 0
    assert ids == ["procfile-host-7", "procfile-host-7"]
