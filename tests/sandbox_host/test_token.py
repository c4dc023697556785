"""A host refuses a token shorter than 32 characters: the token grants code execution,
and a short one can be guessed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.host import ROOT, start_host
from tests.timing import scaled

pytestmark = pytest.mark.peer


def start(token: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_host", "--listen", "127.0.0.1:0"],
        cwd=ROOT,
        env={"HOLDFAST_SANDBOX_TOKEN": token, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )


@pytest.mark.parametrize("token", ["hunter2", "x" * 31])
def test_a_short_token_refuses_to_start_with_exit_2(token):
    done = start(token)
    assert done.returncode == 2
    assert "HOLDFAST_SANDBOX_TOKEN is shorter than 32 characters" in done.stderr
    assert token not in done.stderr  # the refusal never echoes the token
    assert done.stdout == ""


def test_a_32_character_token_is_accepted():
    with start_host("y" * 32) as host:
        assert host.url.startswith("ws://")
