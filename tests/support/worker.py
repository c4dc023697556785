"""A real Celery worker process for tests (STYLE habit 8: not eager mode)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            if " ready." in line:
                self.ready.set()

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)  # warm shutdown: running tasks finish
            try:
                self.popen.wait(timeout=scaled(60))
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._reader.join(timeout=5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return self.popen.returncode


@contextlib.contextmanager
def start_worker(env: dict[str, str], *, concurrency: int = 8) -> Iterator[WorkerProcess]:
    """Start ``celery worker`` against the test database and broker. ``env`` adds to
    (and overrides) this process's environment: the pool's settings go there."""
    from django.db import connection

    db = connection.settings_dict
    child_env = dict(os.environ)
    child_env.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            # The test database pytest-django created, not the one it was named after.
            "DATABASE_URL": (
                f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
            ),
            "PYTHONUNBUFFERED": "1",
        }
    )
    child_env.update(env)
    popen = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "controlplane", "worker",
            "--pool", "threads", "--concurrency", str(concurrency),
            "-Q", child_env["HOLDFAST_CELERY_QUEUE"],
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", "INFO", "--hostname", f"test-{os.getpid()}@%h",
        ],
        cwd=ROOT,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    worker = WorkerProcess(popen)
    try:
        if not worker.ready.wait(scaled(60)):
            raise AssertionError(f"celery worker did not become ready:\n{worker.output()}")
        yield worker
    finally:
        worker.stop()
