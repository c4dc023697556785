"""``/api/v1/runs``: create, read, cancel, events (a JSON page, or a short event stream
where no ASGI server serves the long one: sse.py), and steering messages. Thin: parse,
then call runs/actions.py and runs/steering.py."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from controlplane.owners.models import Owner
from controlplane.runs import actions, jobs, notifications, steering
from controlplane.runs.dispatch import enqueue_launch_on_commit
from controlplane.runs.errors import RunsError
from controlplane.runs.models import Run, SteerMessage

from . import idempotency, representations, sse
from .edge import endpoint, owned
from .errors import InvalidField
from .pages import events_page
from .parsing import OBJECT, STRING, Field, json_body

ROUTE = "POST /runs"
# The events page when the caller names none.
DEFAULT_PAGE = 100


def _checked(validate):
    def check(value: object) -> str | None:
        try:
            validate(value)
        except RunsError as exc:
            return exc.message
        return None

    return check


RUN_FIELDS = {
    "job": Field(OBJECT, required=True, check=_checked(jobs.validate_job)),
    "secrets": Field(OBJECT, check=_checked(jobs.validate_secrets)),
    "callback_url": Field(STRING, check=_checked(notifications.validate_callback_url)),
}


def _kind(value: str) -> str | None:
    return None if value in SteerMessage.Kind.values else "must be steer or interrupt"


def _message_body(value: str) -> str | None:
    if len(value.encode("utf-8")) > settings.RUNS_STEER_MAX_BODY_BYTES:
        return f"must be at most {settings.RUNS_STEER_MAX_BODY_BYTES} bytes"
    return None


MESSAGE_FIELDS = {
    "kind": Field(STRING, required=True, check=_kind),
    "body": Field(STRING, check=_message_body),
}


def _answer(row: Run, *, status: int = 200, replayed: bool = False) -> JsonResponse:
    response = JsonResponse(representations.run(row), status=status)
    response["Location"] = f"/api/v1/runs/{row.pk}"
    if replayed:
        response["Idempotent-Replayed"] = "true"
    return response


def _create(owner: str, body: dict):
    run = actions.create_run(owner, body["job"], body.get("secrets"), callback_url=body.get("callback_url", ""))
    # Published once the run (and the idempotency record) commit.
    enqueue_launch_on_commit(run.id)
    return run.pk


@endpoint(("POST",))
def create(request: HttpRequest, owner: Owner) -> JsonResponse:
    key = idempotency.parse_key(request.headers.get("Idempotency-Key"))
    body = json_body(request, RUN_FIELDS)
    run_id, replayed = idempotency.create_once(owner.name, key, ROUTE, body, lambda: _create(owner.name, body))
    return _answer(Run.objects.get(pk=run_id), status=202, replayed=replayed)


@endpoint(("GET",))
def detail(request: HttpRequest, owner: Owner, run_id: str) -> JsonResponse:
    return _answer(owned(Run, run_id, owner))


@endpoint(("POST",))
def cancel(request: HttpRequest, owner: Owner, run_id: str) -> JsonResponse:
    """Cancel a live run (its sandbox is stopped, its keys revoked); an ended one is left
    as it is. Safe to repeat: the answer is the run after."""
    run = owned(Run, run_id, owner)
    actions.cancel_run(run.pk, reason="cancelled through the API")
    run.refresh_from_db()
    return _answer(run)


def _limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_PAGE
    # isascii: str.isdigit() also takes digits like "²" that int() refuses.
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6 or not 1 <= int(raw) <= settings.API_EVENTS_PAGE_MAX:
        raise InvalidField(f"must be a whole number from 1 to {settings.API_EVENTS_PAGE_MAX}", field="limit")
    return int(raw)


def _wants_stream(request: HttpRequest) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


@endpoint(("GET",))
def events(request: HttpRequest, owner: Owner, run_id: str) -> HttpResponse:
    if _wants_stream(request):
        return _short_stream(request, owner, run_id)
    run = owned(Run, run_id, owner)
    after = sse.cursor(None, request.GET.get("after"))
    return JsonResponse(events_page(run, after, _limit(request.GET.get("limit"))))


@endpoint(("GET",))
def events_stream(request: HttpRequest, owner: Owner, run_id: str) -> HttpResponse:
    return _short_stream(request, owner, run_id)


def _short_stream(request: HttpRequest, owner: Owner, run_id: str) -> HttpResponse:
    """Where no ASGI server serves the stream (runserver, WSGI): one page of the events
    stored after the cursor, then the stream ends and the client reconnects (``retry``)
    with Last-Event-ID. Under
    uvicorn the router sends these paths to sse.py instead, which keeps the stream open."""
    run = owned(Run, run_id, owner)
    after = sse.cursor(request.headers.get("Last-Event-ID"), request.GET.get("after"))
    page = events_page(run, after, settings.API_EVENTS_PAGE_MAX)
    chunks = [sse.preamble(), *(sse.frame(e) for e in page["events"])]
    if page["complete"]:
        chunks.append(sse.end_frame(page["run_status"]))
    return StreamingHttpResponse(iter(chunks), content_type=sse.CONTENT_TYPE, headers=sse.HEADERS)


@endpoint(("POST",))
def messages(request: HttpRequest, owner: Owner, run_id: str) -> JsonResponse:
    """A steering message (``steer``, with a body) or an interrupt for a live run; the
    runner's next poll takes it (docs/runner-api.md, "steer"). 409 once the run ended."""
    run = owned(Run, run_id, owner)
    body = json_body(request, MESSAGE_FIELDS)
    if body["kind"] == SteerMessage.Kind.STEER and not body.get("body"):
        raise InvalidField("a steering message needs a body", field="body")
    message = steering.send(run.pk, body["kind"], body.get("body", ""))
    return JsonResponse(
        {"id": message.id, "kind": message.kind, "created_at": representations.time(message.created_at)}, status=202
    )
