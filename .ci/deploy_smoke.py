#!/usr/bin/env python3
"""Prove a deploy from ``requirements.txt`` alone works (STYLE: "a check that passes in
your .venv but not from requirements.txt alone" is a broken deploy).

    DATABASE_URL=postgres://... CELERY_BROKER_URL=redis://... python3 .ci/deploy_smoke.py VENV_DIR

Creates a clean virtualenv in VENV_DIR from ``requirements.txt`` (never the dev file),
then with that interpreter only: migrates, starts a sandbox host, starts a Celery worker
on the Redis broker, runs one execution through ``manage.py execute`` and checks its
output. Standard library only; exits non-zero with the failing step's output.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 90.0
EXPECTED = "deploy smoke ok"


class Child:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], ready: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.match: re.Match[str] | None = None
        self._ready = threading.Event()
        self._pattern = re.compile(ready)
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            found = self._pattern.search(line)
            if found and self.match is None:
                self.match = found
                self._ready.set()
        self._ready.set()

    def wait_ready(self) -> re.Match[str]:
        if not self._ready.wait(START_TIMEOUT_S) or self.match is None:
            fail(f"{self.name} did not start", "\n".join(self.lines[-30:]))
        return self.match

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def fail(step: str, output: str) -> None:
    print(f"deploy smoke FAILED: {step}\n{output}", file=sys.stderr)
    raise SystemExit(1)


def run(step: str, argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        fail(f"{step} (exit {done.returncode})", done.stdout + done.stderr)
    return done.stdout


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for name, scheme in (("DATABASE_URL", "postgres"), ("CELERY_BROKER_URL", "redis://")):
        if not os.environ.get(name, "").startswith(scheme):
            print(f"deploy smoke: {name} must name the production part ({scheme}...)", file=sys.stderr)
            return 2
    target = Path(argv[0]).resolve()
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    python = str(target / "bin" / "python")
    base_env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "PYTHONPATH"}}
    run("pip install -r requirements.txt", [python, "-m", "pip", "install", "-q", "-r", "requirements.txt"], base_env)
    token = secrets.token_urlsafe(32)
    queue = f"holdfast-deploy-smoke-{os.getpid()}"
    env = {
        **base_env,
        "PYTHONUNBUFFERED": "1",
        "HOLDFAST_CELERY_QUEUE": queue,
        # A throwaway key for this check only: production refuses the built-in one.
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    }
    run("manage.py migrate", [python, "manage.py", "migrate", "--noinput"], env)
    host = Child(
        "host",
        [python, "-m", "sandbox_host", "--listen", "127.0.0.1:0"],
        {**env, "HOLDFAST_SANDBOX_TOKEN": token},
        r"listening (ws://\S+) ",
    )
    worker = None
    try:
        url = host.wait_ready().group(1)
        worker_env = {**env, "HOLDFAST_SANDBOX_URL": url, "HOLDFAST_SANDBOX_TOKEN": token}
        worker = Child(
            "celery worker",
            [python, "-m", "celery", "-A", "controlplane", "worker", "--pool", "threads", "--concurrency", "2",
             "-Q", queue, "--without-gossip", "--without-mingle", "--loglevel", "INFO",
             "--hostname", f"deploy-smoke-{os.getpid()}@%h"],
            worker_env,
            r"\bready\.\"?$",  # Celery's line, as the logfmt formatter quotes it
        )  # fmt: skip
        worker.wait_ready()
        started = time.monotonic()
        out = run("manage.py execute", [python, "manage.py", "execute", "--code", f"print({EXPECTED!r})"], env)
        if out.strip() != EXPECTED:
            fail("manage.py execute printed something else", out)
        took = time.monotonic() - started
        print(f"deploy smoke ok: a clean virtualenv from requirements.txt ran one execution ({took:.2f}s)")
        return 0
    finally:
        for child in (worker, host):
            if child is not None:
                child.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
