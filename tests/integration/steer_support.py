"""The web process as production runs it for steering: uvicorn serving controlplane.asgi
(the steer route as a long poll), on a fixed port so it can be SIGKILLed and started
again on the same port. The same life cycle as support.WebProcess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.timing import wait_until

from .support import ROOT, WebProcess, _accepts, db_env_for_subprocess, free_port


class AsgiWebProcess(WebProcess):
    def start(self) -> None:
        env = {**os.environ, **db_env_for_subprocess()}
        argv = [sys.executable, "-m", "uvicorn", "controlplane.asgi:application"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--no-access-log", "--timeout-graceful-shutdown", "2"]
        with open(self.log_path, "a") as log:
            self.popen = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1
        wait_until(lambda: _accepts(self.port) or self.popen.poll() is not None, timeout=30, what="web to listen")
        if self.popen.poll() is not None:
            raise AssertionError(f"web process exited:\n{self.log_path.read_text()[-2000:]}")


@contextlib.contextmanager
def start_asgi_web(log_dir: Path, port: int | None = None) -> Iterator[AsgiWebProcess]:
    web = AsgiWebProcess(port or free_port(), log_dir / "web.log")
    web.start()
    try:
        yield web
    finally:
        web.stop()
