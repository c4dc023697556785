"""Executions submitted through the API really run: a real sandbox host and a real Celery
worker. ``wait: true`` answers with the result; without it the caller polls GET."""

from __future__ import annotations

import json

import pytest

from controlplane.executions.models import Execution
from tests.support.host import start_host
from tests.support.worker import start_worker
from tests.timing import wait_until

from .conftest import make_api

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_execution_submitted_through_the_api_runs_and_its_result_is_read_back(sandbox_token):
    api = make_api("acme")
    with start_host(sandbox_token) as host:
        env = {"HOLDFAST_SANDBOX_URL": host.url, "HOLDFAST_SANDBOX_TOKEN": sandbox_token}
        with start_worker(env):
            waited = api.post("/executions", {"code": "print(6 * 7)", "timeout_s": 10, "wait": True})
            assert waited.status_code == 200, waited.body
            body = json.loads(waited.body)
            assert (body["status"], body["stdout"], body["exit_code"]) == ("succeeded", "42\n", 0)

            queued = json.loads(api.post("/executions", {"code": "import sys; sys.exit(3)", "timeout_s": 10}).body)

            def finished():
                answer = json.loads(api.get(f"/executions/{queued['id']}").body)
                return answer if answer["status"] not in ("queued", "running") else None

            polled = wait_until(finished, timeout=60, interval=0.1, what="the execution to finish")
    assert (polled["status"], polled["exit_code"]) == ("failed", 3)
    assert set(Execution.objects.values_list("owner", flat=True)) == {"acme"}
