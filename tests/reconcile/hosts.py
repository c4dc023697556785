"""A real sandbox host that can be stopped and started again as the same host (a fixed
port, id and state dir), for the reconcile tests."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from tests.support.host import HostProcess, start_host

TOKEN = "hf-reconcile-" + os.urandom(16).hex()
HOST_ID = "reconcile-h1"


class RestartableHost:
    """A real host on a fixed port with a fixed id and state dir, so it can be stopped
    and started again as the same host (what the Procfile's host line now does)."""

    def __init__(self, state_dir: Path, port: int, host_id: str = HOST_ID) -> None:
        self.state_dir, self.port, self.host_id = state_dir, port, host_id
        self.url = f"ws://127.0.0.1:{port}"
        self.process: HostProcess | None = None
        self._stack: contextlib.ExitStack | None = None

    def start(self) -> None:
        self._stack = contextlib.ExitStack()
        args = ("--listen", f"127.0.0.1:{self.port}", "--state-dir", str(self.state_dir))
        self.process = self._stack.enter_context(start_host(TOKEN, host_id=self.host_id, extra_args=args))
        assert self.process.url == self.url, self.process.url

    def stop(self) -> None:
        """SIGTERM: the host drains its executions and exits; run sandboxes keep running."""
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def record(self, run_id: object) -> dict:
        return json.loads((self.state_dir / "runs" / f"{run_id}.json").read_text())
