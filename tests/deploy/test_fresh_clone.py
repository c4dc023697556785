"""The Procfile's processes on the embedded default work on a fresh clone (no ``var/``
yet), and ``manage.py execute`` answers one clear line, never a traceback, when what it
needs is missing: an unmigrated database, no worker running, no host configured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from holdfast_devtools import processes
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.peer]
ROOT = Path(__file__).resolve().parents[2]


def embedded_env(var_dir: Path) -> dict[str, str]:
    """This machine's environment minus everything that names a production part."""
    drop = {"DATABASE_URL", "CELERY_BROKER_URL", "HOLDFAST_CACHE_URL", "HOLDFAST_CELERY_QUEUE"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("HOLDFAST_SANDBOX")}
    return {**env, "DJANGO_SETTINGS_MODULE": "controlplane.settings", "HOLDFAST_VAR_DIR": str(var_dir)}


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(120)
    )


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


def test_procfile_processes_and_execute_on_a_fresh_clone(tmp_path):
    var_dir = tmp_path / "clone" / "var"  # its parent does not exist either
    env = embedded_env(var_dir)

    run_id = "3f1d6c2e-0000-4000-8000-000000000001"
    for command in (
        ("execute", "--code", "print(1)"),
        ("create_run", "--shell", "echo hi"),
        ("show_run", run_id),
        ("cancel_run", run_id),
        ("register_host", "h1"),
        ("drain_host", "h1"),
    ):
        before_migrate = manage(env, *command)
        assert before_migrate.returncode != 0, command
        assert "migrate" in one_line(before_migrate.stderr), command

    # The Procfile's web line starts with migrate.
    migrated = manage(env, "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    assert (var_dir / "holdfast.sqlite3").exists()

    # The Procfile's worker line (no host configured).
    worker = processes.Child(
        "worker",
        [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool", "threads",
         "--concurrency", "2", "-Q", "holdfast", "--loglevel", "INFO"],
        env,
        processes.WORKER_READY,
    )  # fmt: skip
    try:
        worker.wait_ready(scaled(90))
        no_host = manage(env, "execute", "--code", "print(1)")
        assert no_host.returncode == 70
        assert "HOLDFAST_SANDBOX_URL is not set" in one_line(no_host.stderr)
    finally:
        worker.stop()
    assert "FileNotFoundError" not in "\n".join(worker.lines)

    no_worker = manage(env, "execute", "--code", "print(1)", "--pickup-wait", "1")
    assert no_worker.returncode == 130
    assert "No worker picked up the execution" in one_line(no_worker.stderr)

    # A broker that does not answer: one line naming it (never its password).
    no_broker = manage({**env, "CELERY_BROKER_URL": "redis://:hunter2@127.0.0.1:1/0"}, "create_run", "--shell", "true")
    assert no_broker.returncode == 1
    line = one_line(no_broker.stderr)
    assert "cannot reach the Celery broker (127.0.0.1:1/0)" in line and "hunter2" not in line
