"""The event stream where no ASGI server serves it (runserver, WSGI; Django's test
client here): one page after the cursor, then the stream ends and the client
reconnects; the run-api role serves none of the public API."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.runs import actions

from .conftest import JOB

pytestmark = pytest.mark.django_db


def _messages(text: str) -> list[dict]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        out.append(fields)
    return out


def test_one_page_after_last_event_id_then_the_end_once_the_run_ended(api):
    run = actions.create_run("acme", JOB, {})
    actions.claim_for_launch(run.id)
    actions.runner_hello(run.id, "sandbox-1")
    events = [actions.EventIn("stdout", {"line": x}, timezone.now()) for x in ("a", "b", "c")]
    actions.append_events(run.id, "b1", events)
    answer = api.get(f"/runs/{run.id}/events/stream", headers={"Last-Event-ID": "1"})
    assert answer.status_code == 200 and answer["Content-Type"] == "text/event-stream"
    messages = _messages(answer.body.decode())
    assert messages[0] == {"retry": "1000"}
    assert [m["id"] for m in messages[1:]] == ["2", "3"]
    actions.cancel_run(run.id)
    answer = api.get(f"/runs/{run.id}/events", headers={"Accept": "text/event-stream", "Last-Event-ID": "3"})
    messages = _messages(answer.body.decode())
    assert [m.get("id") for m in messages[1:]] == ["4", None] and messages[-1]["event"] == "end"


@override_settings(ROOT_URLCONF="controlplane.runner_urls")
def test_the_runner_api_role_serves_no_public_api(api):
    answer = api.client.post("/api/v1/executions", data=b"{}", content_type="application/json")
    assert answer.status_code == 404


def test_the_asgi_router_streams_only_where_the_public_api_is_served(settings):
    from controlplane.api import sse

    scope = {"type": "http", "method": "GET", "path": "/api/v1/runs/x/events/stream", "headers": []}
    assert sse.stream_route(scope) == "x"
    assert sse.stream_route({**scope, "path": "/api/v1/runs/x/events"}) is None
    negotiated = {**scope, "path": "/api/v1/runs/x/events", "headers": [(b"accept", b"text/event-stream")]}
    assert sse.stream_route(negotiated) == "x"
    assert sse.stream_route({**scope, "method": "POST"}) is None


def _asgi_get(path: str) -> int:
    import asyncio

    from controlplane.asgi import application

    sent: list[dict] = []
    requested = []

    async def receive():
        if not requested:
            requested.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected; the handler cancels this

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("10.200.0.1", 5000),
        "server": ("testserver", 80),
    }
    asyncio.run(application(scope, receive, send))
    return sent[0]["status"]


@pytest.mark.parametrize(("urlconf", "status"), [("controlplane.urls", 401), ("controlplane.runner_urls", 404)])
def test_the_asgi_router_serves_the_stream_only_in_the_role_with_the_public_api(urlconf, status):
    with override_settings(ROOT_URLCONF=urlconf):
        assert _asgi_get("/api/v1/runs/00000000-0000-0000-0000-000000000000/events/stream") == status
