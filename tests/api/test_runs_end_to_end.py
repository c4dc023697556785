"""A run through the whole path, driven only over HTTP as a service drives it: POST
/runs on a real web process (uvicorn), a real worker launches it on a real sandbox
host, its runner calls the same web process back; the service follows the event
stream, steers the job, and the stream ends with the run. The run's secret reaches the
job and appears in no answer and no log line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import TOKEN, launching_worker
from tests.integration.support import stop_runs
from tests.support.host import start_host

from .conftest import RUN_SECRET, make_api
from .web import EventStream, request, start_api_web

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

JOB_SOURCE = """
import json, os, sys
print("ready", len(os.environ["API_TOKEN"]), flush=True)
message = json.loads(sys.stdin.readline())
print("got", message["kind"], message["body"], flush=True)
"""


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("api-host-state")


@pytest.fixture(scope="module")
def host(state_dir):
    try:
        with start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as running:
            yield running
    finally:
        stop_runs(state_dir)


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup):
    with start_api_web(tmp_path_factory.mktemp("api-e2e-web"), HOLDFAST_API_SSE_POLL_S="0.1") as process:
        yield process


@pytest.fixture(scope="module")
def worker(host, web, django_db_setup):
    with launching_worker(host, web.url) as process:
        yield process


def test_a_run_created_over_http_streams_its_events_and_is_steered(worker, web):
    api = make_api("acme")
    headers = {"Authorization": f"Bearer {api.key}"}
    body = {"job": {"kind": "python", "source": JOB_SOURCE, "timeout_s": 120}, "secrets": {"API_TOKEN": RUN_SECRET}}
    status, _, raw = request(web.port, "POST", "/api/v1/runs", body, headers)
    assert status == 202, raw
    run_id = json.loads(raw)["id"]

    stream = EventStream(web.port, f"/api/v1/runs/{run_id}/events/stream", headers)
    try:
        assert stream.status == 200 and stream.next() == {"retry": "1000"}
        # The job got its secret (it prints only the length: events are the job's output).
        assert stream.events(1)[0]["data"]["line"] == f"ready {len(RUN_SECRET)}"
        steer = {"kind": "steer", "body": "look at the failing test first"}
        status, _, raw = request(web.port, "POST", f"/api/v1/runs/{run_id}/messages", steer, headers)
        assert status == 202, raw
        got = stream.events(1)[0]
        assert got["data"]["line"] == "got steer look at the failing test first"
        result = stream.events(1)[0]
        assert result["type"] == "result" and result["data"]["status"] == "succeeded"
        assert stream.next() == {"event": "end", "data": '{"run_status": "succeeded"}'}
        assert stream.next() is None
    finally:
        stream.close()

    status, _, raw = request(web.port, "GET", f"/api/v1/runs/{run_id}", headers=headers)
    assert status == 200 and json.loads(raw)["status"] == "succeeded"
    assert RUN_SECRET not in web.log_path.read_text() and RUN_SECRET not in worker.output()
