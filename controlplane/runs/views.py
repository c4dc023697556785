"""The runner's internal API: thin views that parse, authenticate and call actions.

Every route checks, in this order (docs/runner-api.md):
1. a Bearer token is present, else 401 unauthorized;
2. the run exists, else 404 not_found;
3. the run is not terminal, else 409 run_terminal (with the recorded status);
4. the token verifies in constant time and is not revoked, else 401 unauthorized.
``hello`` takes the launch key; every other route takes the session token.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from . import actions, credentials, payloads, steering
from .errors import MethodNotAllowed, RunNotFound, RunsError, RunTerminal, Unauthorized
from .models import Run, RunArtifact

Handler = Callable[[HttpRequest, Run], HttpResponse]


def _bearer(request: HttpRequest) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized()
    return token


def authenticate(request: HttpRequest, run_id: str, credential: str) -> Run:
    token = _bearer(request)
    try:
        pk = uuid.UUID(run_id)
    except ValueError:
        raise RunNotFound() from None
    run = Run.objects.filter(pk=pk).first()
    if run is None:
        raise RunNotFound()
    if run.is_terminal:
        raise RunTerminal(run.status)
    stored = run.launch_key_hash if credential == credentials.LAUNCH else run.session_token_hash
    # Revocation is checked on its own, not only through the status: a key whose run
    # ended must never authenticate again, whatever later happens to the row.
    if run.key_revoked_at is not None or not credentials.matches(token, stored):
        raise Unauthorized()
    return run


def error_response(exc: RunsError) -> JsonResponse:
    response = JsonResponse(exc.body(), status=exc.http_status)
    if isinstance(exc, MethodNotAllowed):
        response["Allow"] = ", ".join(exc.allowed)
    return response


def runner_endpoint(methods: tuple[str, ...], credential: str = credentials.SESSION) -> Callable:
    def wrap(handler: Handler) -> Callable[[HttpRequest, str], HttpResponse]:
        @csrf_exempt
        @functools.wraps(handler)
        def view(request: HttpRequest, run_id: str) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise MethodNotAllowed(list(methods))
                return handler(request, authenticate(request, run_id, credential))
            except RunsError as exc:
                return error_response(exc)

        return view

    return wrap


@runner_endpoint(("POST",), credential=credentials.LAUNCH)
def hello(request: HttpRequest, run: Run) -> HttpResponse:
    instance_id = payloads.parse_hello(request)
    token = actions.runner_hello(run.id, instance_id)
    return JsonResponse({"run_id": str(run.id), "session_token": token})


@runner_endpoint(("GET",))
def bundle(request: HttpRequest, run: Run) -> HttpResponse:
    return JsonResponse(actions.bundle(run))


@runner_endpoint(("POST",))
def events(request: HttpRequest, run: Run) -> HttpResponse:
    batch_key, batch = payloads.parse_events(request)
    first_seq, count = actions.append_events(run.id, batch_key, batch)
    return JsonResponse({"first_seq": first_seq, "count": count})


@runner_endpoint(("GET", "POST"))
def session_state(request: HttpRequest, run: Run) -> HttpResponse:
    if request.method == "GET":
        return HttpResponse(actions.load_session_state(run.id), content_type="application/octet-stream")
    data = payloads.read_body(request, settings.RUNS_MAX_SESSION_STATE_BYTES)
    return JsonResponse({"uri": actions.save_artifact(run.id, RunArtifact.Kind.SESSION_STATE, data)})


@runner_endpoint(("POST",))
def transcript(request: HttpRequest, run: Run) -> HttpResponse:
    data = payloads.read_body(request, settings.RUNS_MAX_TRANSCRIPT_BYTES)
    return JsonResponse({"uri": actions.save_artifact(run.id, RunArtifact.Kind.TRANSCRIPT, data)})


@runner_endpoint(("POST",))
def push_token(request: HttpRequest, run: Run) -> HttpResponse:
    request_key, scope = payloads.parse_push_token(request)
    token, expires_at = actions.mint_push_token(run.id, request_key, scope)
    return JsonResponse({"token": token, "expires_at": expires_at.isoformat()})


@runner_endpoint(("POST",))
def result(request: HttpRequest, run: Run) -> HttpResponse:
    verdict = payloads.parse_result(request)
    receipt = actions.record_result(run.id, **verdict)
    return JsonResponse({"status": verdict["status"], "receipt_sha256": receipt.sha256})


@runner_endpoint(("GET",))
def steer(request: HttpRequest, run: Run) -> HttpResponse:
    # The short poll (WSGI, runserver, the embedded default). Under ASGI the same route is
    # a long poll served by steer_asgi.py; both apply the ack the same way.
    poll = steering.parse_poll(dict(request.GET.lists()))
    messages = steering.serve(run, poll)
    return JsonResponse({"messages": messages, "next_poll_s": 0 if messages else settings.RUNS_STEER_SHORT_POLL_S})
