"""The API through a real web process (uvicorn, as the Procfile runs it): an idempotent
retry after a response cut mid-body creates one execution; the event stream delivers
events as they are stored, resumes after Last-Event-ID, ends when the run does and is
bounded in time, and holds no thread per stream."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.executions.models import Execution
from controlplane.runs import actions
from controlplane.runs.models import Run
from tests.timing import wait_until

from . import openapi_check
from .conftest import JOB, make_api
from .web import EventStream, post_and_drop, request, start_api_web

pytestmark = pytest.mark.django_db(transaction=True)

STREAMS_ALLOWED = 24
STREAMS_PER_OWNER = 16


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup):
    env = {
        "HOLDFAST_API_SSE_POLL_S": "0.1",
        "HOLDFAST_API_SSE_MAX_STREAMS": str(STREAMS_ALLOWED),
        "HOLDFAST_API_SSE_MAX_STREAMS_PER_OWNER": str(STREAMS_PER_OWNER),
    }
    with start_api_web(tmp_path_factory.mktemp("api-web"), **env) as process:
        yield process


@pytest.fixture(scope="module")
def announced_web(tmp_path_factory, django_db_setup):
    """A web process whose streams would read the database (and send a keep-alive) only
    once an hour: events reach a stream there only if their transaction wakes it."""
    env = {
        "HOLDFAST_API_SSE_POLL_S": "3600",
        "HOLDFAST_API_SSE_SAFETY_POLL_S": "3600",
        "HOLDFAST_API_SSE_HEARTBEAT_S": "3600",
    }
    with start_api_web(tmp_path_factory.mktemp("api-web-announced"), **env) as process:
        yield process


def _bearer(api) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.key}"}


def _checked(method: str, path: str, status: int, headers: dict, body: bytes) -> dict:
    openapi_check.check(method, path, status, headers.get("content-type", ""), body)
    return json.loads(body)


@pytest.mark.parametrize("with_key", [True, False])
def test_a_retry_after_an_answer_cut_mid_response_creates_one_execution(web, with_key):
    api = make_api("acme")
    headers = {**_bearer(api), **({"Idempotency-Key": "cut-1"} if with_key else {})}
    body = {"code": "print(1)", "timeout_s": 5}
    seen = post_and_drop(web.port, "/api/v1/executions", body, headers, keep_bytes=24)
    assert seen.startswith(b"HTTP/1.1 202")
    # The client saw the status line and no more: not the id.
    assert Execution.objects.count() == 1 and str(Execution.objects.get().pk).encode() not in seen
    status, answer_headers, raw = request(web.port, "POST", "/api/v1/executions", body, headers)
    answer = _checked("POST", "/api/v1/executions", status, answer_headers, raw)
    if with_key:
        assert status == 202 and answer_headers.get("idempotent-replayed") == "true"
        assert Execution.objects.count() == 1 and answer["id"] == str(Execution.objects.get().pk)
    else:
        # The control: without the key, the retry is a second execution.
        assert Execution.objects.count() == 2
    for row in Execution.objects.all():  # queued with nobody to run them: leave nothing behind
        request(web.port, "POST", f"/api/v1/executions/{row.pk}/cancel", headers=_bearer(api))


def _running_run(api) -> str:
    run = actions.create_run(api.owner.name, JOB, {"TOKEN": "x"})
    actions.claim_for_launch(run.id)
    actions.runner_hello(run.id, "sandbox-1")
    return str(run.id)


def _append(run_id: str, batch: str, *lines: str) -> None:
    actions.append_events(run_id, batch, [actions.EventIn("stdout", {"line": x}, timezone.now()) for x in lines])


def test_the_stream_delivers_events_as_stored_resumes_after_last_event_id_and_ends_with_the_run(web):
    api = make_api("acme")
    run_id = _running_run(api)
    _append(run_id, "b1", "one", "two", "three")
    path = f"/api/v1/runs/{run_id}/events/stream"
    stream = EventStream(web.port, path, _bearer(api))
    assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
    assert stream.next() == {"retry": "1000"}
    assert [e["data"]["line"] for e in stream.events(3)] == ["one", "two", "three"]
    _append(run_id, "b2", "four", "five")  # stored while the stream is open
    assert [(e["seq"], e["data"]["line"]) for e in stream.events(2)] == [(4, "four"), (5, "five")]
    stream.close()

    # A reconnect with Last-Event-ID gets exactly what came after it.
    resumed = EventStream(web.port, path, {**_bearer(api), "Last-Event-ID": "4"})
    assert [e["seq"] for e in resumed.events(1)] == [5]
    actions.cancel_run(run_id)
    assert [e["type"] for e in resumed.events(1)] == ["result"]
    assert resumed.next() == {"event": "end", "data": '{"run_status": "cancelled"}'}
    assert resumed.next() is None  # the server closed the stream
    resumed.close()

    # The same stream by content negotiation on /events, from ?after=.
    negotiated = EventStream(
        web.port, f"/api/v1/runs/{run_id}/events?after=5", {**_bearer(api), "Accept": "text/event-stream"}
    )
    assert [e["type"] for e in negotiated.events(1)] == ["result"]
    assert negotiated.next()["event"] == "end"
    negotiated.close()
    # Without the Accept header, /events is the JSON page.
    status, headers, raw = request(web.port, "GET", f"/api/v1/runs/{run_id}/events?after=5", headers=_bearer(api))
    assert status == 200 and _checked("GET", f"/api/v1/runs/{run_id}/events", status, headers, raw)["complete"]


@pytest.mark.parametrize(
    ("who", "status", "code"),
    [
        ("another owner", 404, "not_found"),
        ("no key", 401, "unauthorized"),
        ("a Last-Event-ID that is no seq", 400, "invalid_field"),
    ],
)
def test_the_stream_refuses_like_every_route(web, who, status, code):
    api, other = make_api("acme"), make_api("globex")
    run_id = _running_run(api)
    headers = {
        "another owner": _bearer(other),
        "no key": {},
        "a Last-Event-ID that is no seq": {**_bearer(api), "Last-Event-ID": "x"},
    }[who]
    path = f"/api/v1/runs/{run_id}/events/stream"
    got, answer_headers, raw = request(web.port, "GET", path, headers=headers)
    assert got == status
    assert _checked("GET", path, got, answer_headers, raw)["error"]["code"] == code
    if got == 401:
        assert answer_headers["www-authenticate"].startswith("Bearer")


def test_streams_hold_no_thread_each_and_are_capped_per_owner_and_per_process(web):
    api, other = make_api("acme"), make_api("globex")
    path, other_path = (f"/api/v1/runs/{_running_run(a)}/events/stream" for a in (api, other))
    before = web.threads()
    streams = [EventStream(web.port, path, _bearer(api)) for _ in range(STREAMS_PER_OWNER)]
    try:
        # One owner's share is full: its next stream is refused, the other owner's are not.
        status, headers, raw = request(web.port, "GET", path, headers=_bearer(api))
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert _checked("GET", path, status, headers, raw)["error"]["code"] == "owner_limit"
        streams += [
            EventStream(web.port, other_path, _bearer(other)) for _ in range(STREAMS_ALLOWED - STREAMS_PER_OWNER)
        ]
        assert all(s.status == 200 and s.next() == {"retry": "1000"} for s in streams)
        # Django's handler would hold a thread per open stream; here they share the
        # event loop and a small executor.
        assert web.threads() - before < STREAMS_ALLOWED // 2
        status, headers, raw = request(web.port, "GET", other_path, headers=_bearer(other))
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert _checked("GET", other_path, status, headers, raw)["error"]["code"] == "too_many_streams"
    finally:
        for stream in streams:
            stream.close()

    # A closed stream gives its owner's share back, once the server has seen it go.
    def reopened() -> EventStream | None:
        stream = EventStream(web.port, path, _bearer(api))
        if stream.status == 200:
            return stream
        stream.close()
        return None

    wait_until(reopened, timeout=10, what="a stream of the owner whose streams closed").close()


def test_a_stream_ends_by_itself_after_its_bound(tmp_path):
    api = make_api("acme")
    run_id = _running_run(api)
    with start_api_web(tmp_path, HOLDFAST_API_SSE_MAX_S="1", HOLDFAST_API_SSE_POLL_S="0.1") as short:
        stream = EventStream(short.port, f"/api/v1/runs/{run_id}/events/stream", _bearer(api))
        assert stream.next() == {"retry": "1000"}
        # The run is still live, yet the server ends the stream: the client reconnects.
        assert stream.next() is None
        stream.close()
    assert Run.objects.get(pk=run_id).status == "running"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
def test_stored_events_wake_a_parked_stream_without_its_poll(announced_web):
    api = make_api("acme")
    run_id = _running_run(api)
    stream = EventStream(announced_web.port, f"/api/v1/runs/{run_id}/events/stream", _bearer(api))
    assert stream.next() == {"retry": "1000"}
    _append(run_id, "a1", "one")  # the stream has read (nothing) and parked by now, or reads it first
    assert [e["data"]["line"] for e in stream.events(1)] == ["one"]
    _append(run_id, "a2", "two", "three")
    assert [e["data"]["line"] for e in stream.events(2)] == ["two", "three"]
    actions.cancel_run(run_id)  # the run's result event is announced too, and ends the stream
    assert [e["type"] for e in stream.events(1)] == ["result"]
    assert stream.next() == {"event": "end", "data": '{"run_status": "cancelled"}'}
    stream.close()
