"""Issue 3, test 3: per endpoint, through a proxy that cuts the REAL server's response
mid-body once (the server applied the request; the runner saw half an answer and a
reset). The runner's transport replays it, since every endpoint is replay-safe, and
the server's rows show no duplicate: one events batch, the same session token, one
result."""

from __future__ import annotations

import io
import uuid
from contextlib import redirect_stderr

import pytest

from controlplane.runs import actions, credentials
from controlplane.runs.models import Receipt, Run, RunEvent, RunEventBatch, RunStatus
from runner.main import JobOutcome, report_result
from runner.redact import Redactor
from runner.transport import ControlPlaneClient
from tests.timing import scaled

from .support import CUT, FORWARD, HttpProxy, start_web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.peer]

# Every call a runner makes in its life, in order: (method, endpoint).
LIFE = [
    ("POST", "hello"),
    ("GET", "bundle"),
    ("POST", "events"),
    ("POST", "result"),
]
EVENTS = [{"type": "stdout", "data": {"line": f"line {i}"}, "ts": "2026-01-01T00:00:00+00:00"} for i in (1, 2, 3)]


class CutOnce:
    def __init__(self, method: str, endpoint: str) -> None:
        self.target = (method, endpoint)
        self.cut = False

    def __call__(self, method: str, endpoint: str) -> str:
        if (method, endpoint) == self.target and not self.cut:
            self.cut = True
            return CUT
        return FORWARD


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup):
    with start_web(tmp_path_factory.mktemp("web-cut")) as process:
        yield process


def _live(client: ControlPlaneClient, instance_id: str) -> dict:
    """The runner's life, call by call, as runner.main makes each call."""
    seen: dict = {}
    seen["session"] = client.call("POST", "hello", body={"instance_id": instance_id})["session_token"]
    client.authenticate(seen["session"])
    seen["job"] = client.call("GET", "bundle")["job"]
    seen["events"] = client.call("POST", "events", body={"batch_key": str(uuid.uuid4()), "events": EVENTS})
    stderr = io.StringIO()
    with redirect_stderr(stderr):
        report_result(client, JobOutcome("succeeded", 0, ""), Redactor())
    seen["result_stderr"] = stderr.getvalue()
    return seen


@pytest.mark.parametrize(("method", "endpoint"), LIFE, ids=[f"{m} {e}" for m, e in LIFE])
def test_a_response_cut_mid_body_is_replayed_and_the_server_keeps_one_copy(web, method, endpoint, capsys):
    run = actions.create_run("acme", {"kind": "shell", "command": "true"})
    key = actions.claim_for_launch(run.id).launch_key
    retries: list[tuple[str, int, str]] = []
    with HttpProxy(web.port, CutOnce(method, endpoint)) as proxy:
        client = ControlPlaneClient(
            proxy.url, str(run.id), key, read_timeout_s=scaled(30), on_retry=lambda *r: retries.append(r)
        )
        seen = _live(client, "instance-1")
    assert proxy.count(action=CUT) == 1, "the proxy never cut this endpoint's response"
    # Replayed exactly once, by the transport: the cut call and nothing else retried.
    assert [(r[0], r[1]) for r in retries] == [(endpoint, 1)], retries
    assert proxy.count(method, endpoint) == 2
    assert len(proxy.seen) == len(LIFE) + 1

    run = Run.objects.get(pk=run.id)
    assert run.status == RunStatus.SUCCEEDED and run.exit_code == 0
    # hello: the replay got the same session token, the one bound to this instance.
    assert credentials.matches(seen["session"], run.session_token_hash) and run.instance_id == "instance-1"
    assert seen["job"]["command"] == "true"
    # events: one batch, three events (and the control plane's result), seqs 1..4.
    assert seen["events"] == {"first_seq": 1, "count": 3}
    assert RunEventBatch.objects.filter(run=run).count() == 1
    assert list(RunEvent.objects.filter(run=run).values_list("seq", "type")) == [
        (1, "stdout"),
        (2, "stdout"),
        (3, "stdout"),
        (4, "result"),
    ]
    # result: recorded once; a replay answered 409 run_terminal counts as recorded, silently.
    assert Receipt.objects.filter(run=run).count() == 1
    assert seen["result_stderr"] == ""
    with capsys.disabled():
        print(
            f"\n[cut {method} {endpoint}] requests={len(proxy.seen)} replays={len(retries)} "
            f"batches=1 events={run.events.count()} receipts=1 status={run.status}"
        )
