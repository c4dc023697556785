"""Start sandbox hosts and Celery workers as child processes on this machine.

Used by the main job (``manage.py demo``) and the deploy demonstration, where one
command must bring up the whole path. Production runs them from the Procfile instead.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening (wss?://\S+) host_id=(\S+)")

# A host prints its address within a second or two; the worker imports Django and
# Celery and connects to the broker, which on a cold, busy machine takes longer.
HOST_START_TIMEOUT_S = 30.0
WORKER_START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0


class Child:
    """A child process whose output is collected by a thread (so it never blocks on a
    full pipe) and scanned for a readiness line."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], ready: re.Pattern[str]) -> None:
        self.name = name
        self.lines: list[str] = []
        self.match: re.Match[str] | None = None
        self._ready = threading.Event()
        self._pattern = ready
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            if not self._ready.is_set():
                found = self._pattern.search(line)
                if found:
                    self.match = found
                    self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float) -> re.Match[str]:
        if not self._ready.wait(timeout) or self.match is None:
            self.stop()
            tail = "\n".join(self.lines[-20:])
            raise RuntimeError(f"{self.name} did not start:\n{tail}")
        return self.match

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._reader.join(timeout=5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return self.popen.returncode


def start_host(
    token: str,
    *,
    host_id: str,
    listen: str = "127.0.0.1:0",
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> Child:
    child_env = {**os.environ, **(env or {}), "HOLDFAST_SANDBOX_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "sandbox_host", "--listen", listen, "--host-id", host_id, *extra_args]
    host = Child(f"host {host_id}", argv, child_env, LISTENING)
    host.wait_ready(HOST_START_TIMEOUT_S)
    return host


def host_url(host: Child) -> str:
    assert host.match is not None
    return host.match.group(1)


def host_port(host: Child) -> int:
    return int(host_url(host).rsplit(":", 1)[1])


def start_worker(
    env: dict[str, str], *, concurrency: int = 4, name: str = "worker", extra_args: tuple[str, ...] = ()
) -> Child:
    child_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    queue = child_env.get("HOLDFAST_CELERY_QUEUE", "holdfast")
    argv = [
        sys.executable, "-m", "celery", "-A", "controlplane", "worker",
        "--pool", "threads", "--concurrency", str(concurrency), "-Q", queue,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel", "INFO", "--hostname", f"{name}-{os.getpid()}-{time.monotonic_ns()}@%h",
        *extra_args,
    ]  # fmt: skip
    worker = Child(name, argv, child_env, re.compile(r"\bready\.$"))
    worker.wait_ready(WORKER_START_TIMEOUT_S)
    return worker
