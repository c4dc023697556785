"""Settings that say no: every environment setting that does not parse stops start-up
with ImproperlyConfigured naming the variable; a deploy refuses the built-in secret key;
``check --deploy`` runs clean (the Procfile's web line runs it)."""

from __future__ import annotations

import os
import re
import runpy
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "controlplane" / "settings.py"
PARSED = re.findall(r'env_(?:float|int|bool)\(\s*"([A-Z_]+)"', SETTINGS.read_text())
PRODUCTION_PARTS = ("DATABASE_URL", "CELERY_BROKER_URL", "HOLDFAST_CACHE_URL", "DJANGO_SECRET_KEY")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """This process's environment without anything that names a production part or a
    tunable, so each test sets exactly what it tests."""
    for name in list(os.environ):
        if name.startswith(("HOLDFAST_", "DJANGO_")) or name in PRODUCTION_PARTS:
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOLDFAST_VAR_DIR", str(tmp_path / "var"))
    return monkeypatch


def load() -> dict:
    return runpy.run_path(str(SETTINGS))


def test_the_scan_finds_the_settings():
    assert len(PARSED) > 30
    assert "HOLDFAST_CONNECTION_MAX_AGE_S" in PARSED and "DJANGO_DEBUG" in PARSED


@pytest.mark.parametrize("name", PARSED)
def test_a_value_that_does_not_parse_stops_start_up_naming_the_variable(clean_env, name):
    clean_env.setenv(name, "90s")
    with pytest.raises(ImproperlyConfigured, match=rf"^{name}='90s' is not valid: expected "):
        load()


@pytest.mark.parametrize("raw", ["nan", "inf", "-5", "1e400"])
def test_non_finite_or_below_minimum_numbers_are_refused(clean_env, raw):
    clean_env.setenv("HOLDFAST_ACQUIRE_TIMEOUT_S", raw)
    with pytest.raises(ImproperlyConfigured, match="HOLDFAST_ACQUIRE_TIMEOUT_S"):
        load()


def test_an_unsupported_database_url_names_the_variable(clean_env):
    clean_env.setenv("DATABASE_URL", "mysql://u@h/db")
    with pytest.raises(ImproperlyConfigured, match=r"^DATABASE_URL="):
        load()


def test_a_max_age_below_one_second_falls_back_to_the_default_and_says_so(clean_env, capfd):
    clean_env.setenv("HOLDFAST_CONNECTION_MAX_AGE_S", "0.5")
    loaded = load()
    assert loaded["SANDBOX_CONNECTION_MAX_AGE_S"] == 120.0
    assert loaded["STARTUP_WARNINGS"] == [
        "HOLDFAST_CONNECTION_MAX_AGE_S=0.5 is below 1: running with the default 120 instead"
    ]
    assert "HOLDFAST_CONNECTION_MAX_AGE_S=0.5 is below 1" in capfd.readouterr().err


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_fallback_is_logged_at_start_up(clean_env):
    clean_env.setenv("HOLDFAST_CONNECTION_MAX_AGE_S", "0.2")
    done = manage(dict(os.environ), "check")
    assert done.returncode == 0, done.stderr
    assert "level=error logger=holdfast.settings event=setting_fell_back" in done.stderr
    assert 'message="HOLDFAST_CONNECTION_MAX_AGE_S=0.2' in done.stderr


@pytest.mark.parametrize(
    "env",
    [
        {"DATABASE_URL": "postgres://holdfast@db.internal:5432/holdfast"},
        {"DJANGO_ALLOWED_HOSTS": "holdfast.example.com"},
    ],
    ids=["postgresql", "public-host"],
)
def test_a_deploy_refuses_the_built_in_secret_key(clean_env, env):
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=r"^DJANGO_SECRET_KEY is not set"):
        load()
    clean_env.setenv("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    assert load()["EMBEDDED"] is False


def test_the_embedded_default_keeps_its_built_in_key(clean_env):
    loaded = load()
    assert loaded["EMBEDDED"] is True
    assert loaded["SECRET_KEY"] == loaded["EMBEDDED_SECRET_KEY"]


@pytest.mark.parametrize("deploy", [False, True], ids=["embedded", "deploy"])
def test_check_deploy_runs_clean(clean_env, deploy):
    if deploy:
        clean_env.setenv("DATABASE_URL", "postgres://holdfast@db.internal:5432/holdfast")
        clean_env.setenv("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    done = manage(dict(os.environ), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_the_procfile_web_line_runs_check_deploy():
    web = next(line for line in (ROOT / "Procfile").read_text().splitlines() if line.startswith("web:"))
    assert web.startswith("web: python manage.py check --deploy --fail-level WARNING && ")


def test_runners_are_sent_to_the_runner_api_process_by_default(clean_env):
    """A run's relay carries its job to HOLDFAST_CONTROL_PLANE_URL, so by default that is
    the Procfile's runner-api process (the runner API and nothing else), not web with the
    admin and the public API."""
    procfile = (ROOT / "Procfile").read_text().splitlines()
    runner_api = next(line for line in procfile if line.startswith("runner-api:"))
    web = next(line for line in procfile if line.startswith("web:"))
    port = re.search(r"HOLDFAST_RUNNER_API_PORT:-(\d+)", runner_api).group(1)
    web_port = re.search(r"PORT:-(\d+)", web).group(1)
    url = load()["RUNS_CONTROL_PLANE_URL"]
    assert url.endswith(f":{port}") and not url.endswith(f":{web_port}")
    assert "HOLDFAST_WEB_ROLE=runner-api" in runner_api


def test_check_deploy_fails_when_the_required_isolation_is_lowered(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.SANDBOX_REQUIRED_ISOLATION = "insecure-rlimits"
    with pytest.raises(SystemCheckError, match=r"holdfast\.W001"):
        call_command("check", "--deploy", "--fail-level", "WARNING", "--tag", "security")
    settings.SANDBOX_REQUIRED_ISOLATION = settings.SANDBOX_FULL_ISOLATION
    try:
        call_command("check", "--deploy", "--fail-level", "WARNING", "--tag", "security")
    except SystemCheckError as exc:
        assert "holdfast.W001" not in str(exc)
