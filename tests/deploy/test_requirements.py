"""A deploy from ``requirements.txt`` alone works: a clean virtualenv built from it starts
a sandbox host and a Celery worker on Redis and runs one execution (.ci/deploy_smoke.py,
which .ci/run also runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.worker import children_database_url
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.peer]
ROOT = Path(__file__).resolve().parents[2]


def test_a_clean_virtualenv_from_requirements_txt_runs_an_execution_on_redis(tmp_path):
    from django.conf import settings

    assert settings.CELERY_BROKER_URL.startswith("redis://")
    env = {**os.environ, "DATABASE_URL": children_database_url(), "CELERY_BROKER_URL": settings.CELERY_BROKER_URL}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "deploy_smoke.py"), str(tmp_path / "venv")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deploy smoke ok" in done.stdout
