"""A web process in the runner-api role serves the runner's API and nothing else: the
address a run's relay carries its job to must not hand that job the admin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import override_settings

from tests.support.host import ROOT

pytestmark = pytest.mark.peer


@override_settings(ROOT_URLCONF="controlplane.runner_urls")
@pytest.mark.django_db
def test_the_runner_api_role_serves_no_admin(client):
    assert client.get("/admin/login/").status_code == 404
    assert client.get("/admin/").status_code == 404
    # The runner API is there: an unauthenticated hello is refused by it, not unknown.
    answer = client.post(
        "/internal/runs/00000000-0000-0000-0000-000000000000/hello", data="{}", content_type="application/json"
    )
    assert answer.status_code in (401, 403, 404) and answer.json()["error"]["code"]


@pytest.mark.parametrize(
    ("role", "urlconf"), [("all", "controlplane.urls"), ("runner-api", "controlplane.runner_urls")]
)
def test_the_role_picks_the_url_map(role, urlconf):
    env = {**os.environ, "HOLDFAST_WEB_ROLE": role, "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
    done = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.ROOT_URLCONF)"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == urlconf


def test_an_unknown_role_stops_start_up():
    env = {**os.environ, "HOLDFAST_WEB_ROLE": "admin-only", "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
    done = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; settings.ROOT_URLCONF"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode != 0 and "HOLDFAST_WEB_ROLE must be one of all, runner-api" in done.stderr
