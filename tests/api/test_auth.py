"""Every route wants a live key of the owner it acts for: no key, a malformed, unknown,
wrong or revoked key, a disabled owner's key, and an admin's session all get the same
401 with WWW-Authenticate: Bearer, and change nothing. Requests are rate limited per key
and failed ones per client address."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from controlplane.executions.models import Execution
from controlplane.owners import keys
from controlplane.owners.models import ApiKey, Owner
from controlplane.runs import actions as run_actions
from controlplane.runs.models import Run, SteerMessage

from .conftest import JOB, error

pytestmark = pytest.mark.django_db

EXECUTION_ID = "11111111-1111-1111-1111-111111111111"
RUN_ID = "22222222-2222-2222-2222-222222222222"

ROUTES = [
    ("POST", "/executions", {"code": "print(1)"}),
    ("GET", f"/executions/{EXECUTION_ID}", None),
    ("POST", f"/executions/{EXECUTION_ID}/cancel", None),
    ("POST", "/runs", {"job": JOB}),
    ("GET", f"/runs/{RUN_ID}", None),
    ("POST", f"/runs/{RUN_ID}/cancel", None),
    ("GET", f"/runs/{RUN_ID}/events", None),
    ("GET", f"/runs/{RUN_ID}/events/stream", None),
    ("POST", f"/runs/{RUN_ID}/messages", {"kind": "interrupt"}),
]


@pytest.fixture
def resources(api):
    """An execution and a live run of ``api``'s owner, at the ids ROUTES name."""
    Execution.objects.create(id=EXECUTION_ID, owner=api.owner.name, code="print(1)", timeout_ms=1000, memory_mb=64)
    run = run_actions.create_run(api.owner.name, JOB, {"TOKEN": "x"})
    Run.objects.filter(pk=run.pk).update(id=RUN_ID)


def _unchanged() -> tuple:
    return (
        Execution.objects.count(),
        list(Execution.objects.values_list("status", flat=True)),
        Run.objects.count(),
        list(Run.objects.values_list("status", flat=True)),
        SteerMessage.objects.count(),
    )


def _revoked(api) -> str:
    keys.revoke(ApiKey.objects.get(owner=api.owner))
    return api.key


def _disabled(api) -> str:
    Owner.objects.filter(pk=api.owner.pk).update(is_active=False)
    return api.key


def _wrong_secret(api) -> str:
    return api.key[:-4] + ("AAAA" if not api.key.endswith("AAAA") else "BBBB")


KEYS = {
    "none": lambda api: None,
    "empty": lambda api: "",
    "malformed": lambda api: "not-a-key",
    "unknown prefix": lambda api: "hf_000000000000_" + "x" * 43,
    "wrong secret": _wrong_secret,
    "revoked": _revoked,
    "disabled owner": _disabled,
}


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest.mark.parametrize("which", list(KEYS))
def test_every_route_refuses_a_missing_wrong_or_revoked_key(api, resources, method, path, body, which):
    key = KEYS[which](api)
    before = _unchanged()
    answer = api.call(method, path, body, key=key)
    assert answer.status_code == 401, answer.body
    assert error(answer)["code"] == "unauthorized"
    assert answer["WWW-Authenticate"].startswith("Bearer")
    assert _unchanged() == before


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_every_route_answers_a_good_key(api, resources, method, path, body):
    answer = api.call(method, path, body)
    assert answer.status_code in (200, 202), answer.body


def test_a_non_bearer_scheme_is_refused(api):
    answer = api.post("/executions", {"code": "print(1)"}, key=None, headers={"Authorization": f"Basic {api.key}"})
    assert answer.status_code == 401 and Execution.objects.count() == 0


def test_an_admin_session_does_not_authenticate_the_api(api):
    User.objects.create_superuser("root", "root@example.com", "pw")
    assert api.client.login(username="root", password="pw")
    answer = api.post("/executions", {"code": "print(1)"}, key=None)
    assert answer.status_code == 401 and Execution.objects.count() == 0


@pytest.mark.usefixtures("pinned_rate_clock")
def test_requests_are_rate_limited_per_key(api, other, settings):
    settings.API_RATE_PER_KEY = 3
    answers = [api.get(f"/executions/{EXECUTION_ID}") for _ in range(4)]
    assert [a.status_code for a in answers] == [404, 404, 404, 429]
    assert error(answers[-1])["code"] == "rate_limited" and int(answers[-1]["Retry-After"]) >= 1
    # Another key has its own budget.
    assert other.get(f"/executions/{EXECUTION_ID}").status_code == 404


@pytest.mark.usefixtures("pinned_rate_clock")
def test_failed_authentications_are_rate_limited_per_address(api, settings):
    settings.API_RATE_FAILED_PER_ADDRESS = 2
    statuses = [api.get(f"/executions/{EXECUTION_ID}", key=f"hf_{i:012d}_guess").status_code for i in range(3)]
    assert statuses == [401, 401, 429]
    # The owner's own key still works from elsewhere: only that address is slowed.
    api.client.defaults["REMOTE_ADDR"] = "10.255.255.254"
    assert api.get(f"/executions/{EXECUTION_ID}").status_code == 404


def test_the_key_is_never_in_an_answer(api, resources):
    for method, path, body in ROUTES:
        for key in (api.key, _wrong_secret(api)):
            assert key.encode() not in api.call(method, path, body, key=key).body
    assert json.dumps(error(api.post("/executions", raw=b"{", key=_wrong_secret(api))))
