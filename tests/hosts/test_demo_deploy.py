"""``manage.py demo_deploy`` replaces a host behind a balancer under load with zero
failures, on the production parts and on the embedded default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.peer]

ROOT = Path(__file__).resolve().parents[2]
TOTALS = re.compile(r"totals: submitted (\d+), succeeded (\d+), failed (\d+), unfinished (\d+)")


def run_demo(env: dict[str, str]) -> tuple[int, str, re.Match[str] | None]:
    proc = subprocess.run(
        [sys.executable, "manage.py", "demo_deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(240),
    )
    return proc.returncode, proc.stdout + proc.stderr, TOTALS.search(proc.stdout)


def assert_zero_failures(code: int, output: str, totals: re.Match[str] | None) -> None:
    assert totals is not None, output[-3000:]
    submitted, succeeded, failed, unfinished = map(int, totals.groups())
    assert (failed, unfinished) == (0, 0), output[-3000:]
    assert submitted == succeeded > 0
    assert code == 0, output[-3000:]
    assert "cut by the balancer: 0" in output


@pytest.mark.django_db(transaction=True)
def test_demo_deploy_on_postgresql_and_redis():
    from django.db import connection

    db = connection.settings_dict
    address = f"{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        # The database pytest-django created, so the test's teardown cleans it.
        "DATABASE_URL": f"postgres://{address}/{db['NAME']}",
    }
    assert_zero_failures(*run_demo(env))


def test_demo_deploy_on_the_embedded_default(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "HOLDFAST_CACHE_URL"}}
    env.update({"DJANGO_SETTINGS_MODULE": "controlplane.settings", "HOLDFAST_VAR_DIR": str(tmp_path)})
    code, output, totals = run_demo(env)
    assert "sqlite3" in output and "filesystem://" in output
    assert_zero_failures(code, output, totals)
