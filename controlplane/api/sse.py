"""``GET /api/v1/runs/{id}/events/stream`` (or ``/events`` with ``Accept:
text/event-stream``): a run's events as server-sent events, under ASGI.

Served straight from the ASGI router (controlplane/asgi.py), like the runner's steer
long poll (runs/steer_asgi.py), not through Django's handler, which would hold a thread
for the whole life of each stream. A stream here is a socket and a coroutine: its
database reads (authenticate, one page of events) run briefly in the event loop's
shared executor, and between them it sleeps on the loop.

Rules (docs/api.md, "Streaming events"):
- Each event is one SSE message whose ``id`` is its ``seq``; a client that reconnects
  with ``Last-Event-ID`` (or ``?after=``) gets exactly the events after it, none twice,
  none lost (seqs are gapless per run: runs/models.py).
- New events are announced: the transaction that stores them NOTIFYs the run's id
  (``runs.actions.EVENTS_CHANNEL``), and a stream parked on it (``controlplane/pghub.py``,
  one LISTEN connection per channel and process) reads them when woken, and every
  ``API_SSE_SAFETY_POLL_S`` in case a notification went missing. Without one (SQLite,
  the listener reconnecting) it reads every ``API_SSE_POLL_S``.
- A stream ends with an ``end`` message once the run has ended and every event was
  sent, and in any case after ``API_SSE_MAX_S`` (the client reconnects with
  ``Last-Event-ID``): no stream holds its socket forever, and a deploy's old process
  lets go within that bound. A quiet stream gets a comment every ``API_SSE_HEARTBEAT_S``
  so balancers do not cut it as idle.
- At most ``API_SSE_MAX_STREAMS`` streams per process; beyond, 503 with Retry-After.
  Of those, at most ``API_SSE_MAX_STREAMS_PER_OWNER`` for one owner; beyond, 429
  ``owner_limit``, so one owner's flood leaves the others their streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import ClassVar
from urllib.parse import parse_qs

from django.conf import settings
from django.http import HttpResponse

from controlplane.asyncdb import in_executor
from controlplane.owners.errors import StreamLimit
from controlplane.pghub import hub
from controlplane.runs.actions import EVENTS_CHANNEL
from controlplane.runs.models import Run

from .auth import authenticate
from .edge import owned, translate
from .errors import InvalidField, TooManyStreams
from .pages import events_page

CONTENT_TYPE = "text/event-stream"
# no-cache: every read is fresh; X-Accel-Buffering: nginx passes each message on at once.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# What the client waits before reconnecting after a stream ends (milliseconds).
RECONNECT_MS = 1000
PATH = re.compile(r"^/api/v1/runs/([^/]+)/events(/stream)?/?\Z")


# --- the wire format (shared with the short stream in runs_views.py) ----------------------


def cursor(last_event_id: str | None, after: str | None) -> int:
    """Where to resume: ``Last-Event-ID`` (what an EventSource sends on reconnect) wins
    over ``?after=``; both are a seq already seen."""
    for raw, field in ((last_event_id, "Last-Event-ID"), (after, "after")):
        if raw is None or raw.strip() == "":
            continue
        raw = raw.strip()
        # isascii: str.isdigit() also takes digits like "²" that int() refuses.
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
            raise InvalidField("must be a whole number of at least 0", field=field)
        return int(raw)
    return 0


def preamble() -> bytes:
    return f"retry: {RECONNECT_MS}\n\n".encode()


def frame(event: dict) -> bytes:
    # One line of JSON (json.dumps escapes newlines): an SSE data line cannot hold one.
    return f"id: {event['seq']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def end_frame(run_status: str) -> bytes:
    return f"event: end\ndata: {json.dumps({'run_status': run_status})}\n\n".encode()


HEARTBEAT = b": keep-alive\n\n"


# --- ASGI --------------------------------------------------------------------------------


def stream_route(scope: dict) -> str | None:
    """The run id when this request is a stream this module serves, else None (Django
    serves it: the JSON page, other methods' 405, a 404)."""
    if scope.get("method") != "GET":
        return None
    match = PATH.match(scope.get("path", ""))
    if match is None:
        return None
    if match.group(2):
        return match.group(1)
    accept = dict(scope.get("headers") or []).get(b"accept", b"")
    return match.group(1) if b"text/event-stream" in accept else None


def _open(authorization: str, client: str, run_id: str, last_event_id: str | None, after: str | None):
    owner = authenticate(authorization, client)
    run = owned(Run, run_id, owner)
    return owner.name, run.pk, cursor(last_event_id, after)


def _page(run_pk, after: int) -> dict:
    return events_page(Run.objects.get(pk=run_pk), after, settings.API_EVENTS_PAGE_MAX)


class _Streams:
    """Streams open in this process (one event loop per uvicorn worker process)."""

    open = 0
    by_owner: ClassVar[dict[str, int]] = {}


async def _send_response(send, response: HttpResponse) -> None:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})


async def _watch_disconnect(receive, gone: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


async def handle(scope: dict, receive, send, run_id: str) -> None:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    client = (scope.get("client") or ("",))[0] or ""
    if _Streams.open >= settings.API_SSE_MAX_STREAMS:
        await _send_response(send, TooManyStreams(1).response())
        return
    # The slot is taken before the first await, so streams opening together cannot all
    # pass the check above.
    _Streams.open += 1
    try:
        try:
            owner, run_pk, after = await in_executor(_open)(
                headers.get("authorization", ""),
                client,
                run_id,
                headers.get("last-event-id"),
                (query.get("after") or [None])[-1],
            )
        except Exception as exc:
            response = translate(exc)
            if response is None:
                raise
            await _send_response(send, response)
            return
        # Checked and counted with no await between, as the process's count.
        held = _Streams.by_owner.get(owner, 0)
        if held >= settings.API_SSE_MAX_STREAMS_PER_OWNER:
            await _send_response(send, translate(StreamLimit(f"{held} open on this server")))
            return
        _Streams.by_owner[owner] = held + 1
        try:
            gone = asyncio.Event()
            watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, gone))
            try:
                await _stream(send, run_pk, after, gone)
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        finally:
            left = _Streams.by_owner.pop(owner) - 1
            if left:
                _Streams.by_owner[owner] = left
    finally:
        _Streams.open -= 1


async def _stream(send, run_pk, after: int, gone: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", CONTENT_TYPE.encode()),
                *((k.lower().encode(), v.encode()) for k, v in HEADERS.items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": preamble(), "more_body": True})
    deadline = loop.time() + settings.API_SSE_MAX_S
    last_write = loop.time()
    events_hub = hub(EVENTS_CHANNEL)
    waiter = events_hub.waiter(str(run_pk)) if events_hub is not None else contextlib.nullcontext(None)
    with waiter as woken:
        while not gone.is_set() and loop.time() < deadline:
            if woken is not None:
                woken.clear()  # before the read: what is announced after it wakes us again
            page = await in_executor(_page)(run_pk, after)
            body = b"".join(frame(e) for e in page["events"])
            after = page["next_after"]
            if page["complete"]:
                body += end_frame(page["run_status"])
            elif not body and loop.time() - last_write >= settings.API_SSE_HEARTBEAT_S:
                body = HEARTBEAT
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
                last_write = loop.time()
            if page["complete"]:
                break
            if len(page["events"]) >= settings.API_EVENTS_PAGE_MAX:
                continue  # a backlog: read the next page at once
            announced = woken is not None and events_hub.available
            pause = settings.API_SSE_SAFETY_POLL_S if announced else settings.API_SSE_POLL_S
            heartbeat_due = last_write + settings.API_SSE_HEARTBEAT_S - loop.time()
            # Woken also when the listener (re)connects: then the safety poll applies.
            await _pause(gone, woken, min(pause, heartbeat_due, deadline - loop.time()))
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _pause(gone: asyncio.Event, woken: asyncio.Event | None, seconds: float) -> None:
    """Until the client leaves, new events are announced, or ``seconds`` pass."""
    waits = [asyncio.ensure_future(gone.wait())]
    if woken is not None:
        waits.append(asyncio.ensure_future(woken.wait()))
    try:
        await asyncio.wait(waits, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
