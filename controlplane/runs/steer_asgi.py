"""The steer route under ASGI: a long poll that parks on an ``asyncio.Event``.

Served straight from the ASGI router (controlplane/asgi.py) rather than through
Django's request handler, which would give every in-flight request a thread of its own
for its sync signal receivers; a parked poll here holds a socket and an event, nothing
else. Its database work (authenticate, apply the ack, read pending rows) runs in the
event loop's shared executor and gives its connection back to Django's usual
``close_old_connections`` rules before the poll parks.

The same checks and the same ``steering.serve`` back the WSGI view (views.steer), which
answers at once: that is the short poll of the embedded default and of ``runserver``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from urllib.parse import parse_qs

from django.conf import settings

from controlplane.asyncdb import in_executor
from controlplane.pghub import hub

from . import credentials, steering
from .errors import MethodNotAllowed, RateLimited, RunsError
from .views import authenticate_bearer


def _first(run_id: str, authorization: str, query: dict[str, list[str]], client: str = "") -> tuple[list[dict], bool]:
    # The same check and rate limits as every other runner route.
    run = authenticate_bearer(authorization, client, run_id, credentials.SESSION)
    poll = steering.parse_poll(query)
    return steering.serve(run, poll), poll.legacy


async def poll(
    method: str, run_id: str, authorization: str, query: dict[str, list[str]], client: str = ""
) -> tuple[int, dict]:
    """One poll: (HTTP status, JSON body). Parks up to ``RUNS_STEER_LONG_POLL_S`` when
    nothing is pending and this process's listener is up."""
    short = {"next_poll_s": settings.RUNS_STEER_SHORT_POLL_S}
    try:
        if method != "GET":
            raise MethodNotAllowed(["GET"])
        steer_hub = hub(steering.STEER_CHANNEL)
        # Keyed as NOTIFY spells it (the canonical UUID); a malformed id fails auth anyway.
        with contextlib.suppress(ValueError):
            run_id = str(uuid.UUID(run_id))
        waiter = steer_hub.waiter(run_id) if steer_hub is not None else contextlib.nullcontext(None)
        with waiter as event:
            messages, legacy = await in_executor(_first)(run_id, authorization, query, client)
            if messages:
                return 200, {"messages": messages, "next_poll_s": 0}
            if legacy or event is None or not steer_hub.available or steer_hub.parked > settings.RUNS_STEER_MAX_PARKED:
                return 200, {"messages": messages, **short}
            # Between half and all of the bound, at random: polls that parked together (after
            # a restart) must not all come back together and queue on the database at once.
            wait_s = settings.RUNS_STEER_LONG_POLL_S * random.uniform(0.5, 1.0)
            try:
                await asyncio.wait_for(event.wait(), wait_s)
            except TimeoutError:
                # Not woken: nothing committed for this run while it was parked (a lost
                # listener wakes every poll), so there is nothing to read.
                return 200, {"messages": [], "next_poll_s": 0}
            messages = await in_executor(steering.pending_for)(run_id)
            return 200, {"messages": messages, "next_poll_s": 0}
    except RateLimited as exc:
        return exc.http_status, {**exc.body(), "retry_after_s": exc.retry_after_s}
    except RunsError as exc:
        return exc.http_status, exc.body()


async def handle(scope: dict, receive, send, run_id: str) -> None:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    client = (scope.get("client") or ("",))[0] or ""
    status, body = await poll(scope["method"], run_id, headers.get("authorization", ""), query, client)
    retry_after = body.pop("retry_after_s", None) if status == 429 else None
    payload = json.dumps(body).encode()
    extra = [(b"allow", b"GET")] if status == 405 else []
    if retry_after is not None:
        extra.append((b"retry-after", str(retry_after).encode()))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
