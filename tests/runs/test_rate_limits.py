"""The runner API and admin sign-in are rate limited in Django's cache (Redis here, as
in production): per run key and per client address on the runner API, per client
address on the admin login; the excess gets 429 with Retry-After."""

from __future__ import annotations

import uuid

import pytest
from django.core.cache import cache
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_counters(pinned_rate_clock):
    cache.clear()
    yield
    cache.clear()


def address() -> str:
    """A client address of its own, so no other test's requests count against it."""
    return f"198.51.100.{uuid.uuid4().int % 250 + 1}"


@override_settings(RUNS_API_RATE_PER_KEY=5, RUNS_API_RATE_WINDOW_S=60)
def test_a_run_key_over_its_limit_gets_429_with_retry_after(running):
    answers = [running.get("bundle").status_code for _ in range(7)]
    assert answers == [200] * 5 + [429, 429]
    limited = running.get("bundle")
    assert limited.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(limited["Retry-After"]) <= 60
    # Another run key is not affected.
    assert running.get("bundle", token="hfs_" + "0" * 64).status_code == 401


@override_settings(RUNS_API_RATE_PER_ADDRESS=4, RUNS_API_RATE_WINDOW_S=60)
def test_an_address_guessing_keys_gets_429_before_any_key_is_checked(running):
    client, ip = Client(), address()
    path = f"/internal/runs/{running.run_id}/bundle"
    codes = [
        client.get(path, headers={"Authorization": f"Bearer hfs_{i:064d}"}, REMOTE_ADDR=ip).status_code
        for i in range(6)
    ]
    assert codes == [401] * 4 + [429, 429]
    # The run's own runner, from another address, is served.
    assert running.get("bundle").status_code == 200


@override_settings(ADMIN_LOGIN_RATE_LIMIT=3, ADMIN_LOGIN_RATE_WINDOW_S=60)
def test_admin_sign_in_attempts_over_the_limit_get_429():
    client, ip = Client(), address()
    codes = [
        client.post("/admin/login/", {"username": "admin", "password": f"guess{i}"}, REMOTE_ADDR=ip).status_code
        for i in range(5)
    ]
    assert codes == [200] * 3 + [429, 429]
    limited = client.post("/admin/login/", {"username": "admin", "password": "x"}, REMOTE_ADDR=ip)
    assert 1 <= int(limited["Retry-After"]) <= 60
    # Reading the login page is not an attempt.
    assert client.get("/admin/login/", REMOTE_ADDR=ip).status_code == 200


@override_settings(RUNS_API_RATE_PER_ADDRESS=4, RUNS_API_RATE_WINDOW_S=60)
def test_a_job_guessing_keys_does_not_starve_runners_behind_the_same_address(running):
    """Every sandbox of a host reaches the API from the host's one address (its relays):
    a job that spends that address's budget on made-up keys must not get its
    neighbours' runners refused."""
    client, ip = Client(), address()
    path = f"/internal/runs/{running.run_id}/bundle"
    for i in range(6):
        client.get(path, headers={"Authorization": f"Bearer hfs_{i:064d}"}, REMOTE_ADDR=ip)
    served = client.get(path, headers={"Authorization": f"Bearer {running.token}"}, REMOTE_ADDR=ip)
    assert served.status_code == 200
