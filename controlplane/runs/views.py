"""The runner's internal API: thin views that parse, authenticate and call actions.

Every route checks, in this order (docs/runner-api.md):
1. a Bearer token is present, else 401 unauthorized;
2. the run exists, else 404 not_found;
3. the token verifies in constant time, else 401 unauthorized: nothing about the run
   (not even whether it ended) is told to a caller that cannot prove it is its runner;
4. the run is not terminal, else 409 run_terminal (with the recorded status);
5. the key is not revoked, else 401 unauthorized.
``hello`` takes the launch key; every other route takes the session token.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane import ratelimit

from . import actions, credentials, payloads, steering
from .errors import MethodNotAllowed, RateLimited, RunNotFound, RunsError, RunTerminal, Unauthorized
from .models import Run

Handler = Callable[[HttpRequest, Run], HttpResponse]


def _bearer(authorization: str) -> str:
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized()
    return token


def _rate_limit_key(authorization: str) -> None:
    """Per run key (one runaway runner), before any database work."""
    _, _, token = authorization.partition(" ")
    if token.strip():
        retry = ratelimit.hit(
            "runner-key", token.strip(), limit=settings.RUNS_API_RATE_PER_KEY, window_s=settings.RUNS_API_RATE_WINDOW_S
        )
        if retry is not None:
            raise RateLimited(retry)


def _refused(client: str, exc: RunsError) -> RunsError:
    """A request that failed authentication counts against its client address, and past
    the limit is answered 429: a flood of made-up keys stops there. Only failures count,
    because every sandbox of a host reaches us from that host's one address (its
    relays): a job guessing keys must not spend the budget of its neighbours' runners,
    whose keys check."""
    retry = ratelimit.hit(
        "runner-addr-failed",
        client or "unknown",
        limit=settings.RUNS_API_RATE_PER_ADDRESS,
        window_s=settings.RUNS_API_RATE_WINDOW_S,
    )
    return RateLimited(retry) if retry is not None else exc


def authenticate(request: HttpRequest, run_id: str, credential: str) -> Run:
    return authenticate_bearer(
        request.headers.get("Authorization", ""), ratelimit.client_address(request), run_id, credential
    )


def authenticate_bearer(authorization: str, client: str, run_id: str, credential: str) -> Run:
    """The run whose ``credential`` the ``Authorization`` header carries, for a request
    from ``client`` (its peer address, which failures are counted against)."""
    _rate_limit_key(authorization)
    token = _bearer(authorization)
    try:
        pk = uuid.UUID(run_id)
    except ValueError:
        raise _refused(client, RunNotFound()) from None
    run = Run.objects.filter(pk=pk).first()
    if run is None:
        raise _refused(client, RunNotFound())
    stored = run.launch_key_hash if credential == credentials.LAUNCH else run.session_token_hash
    # Authenticate before answering anything about the run: whoever knows a run id but
    # not its key must not learn its status from a 409.
    if not credentials.matches(token, stored):
        raise _refused(client, Unauthorized())
    # Its own runner is told the run ended (a revoked key still proves who is asking),
    # so it stops instead of retrying.
    if run.is_terminal:
        raise RunTerminal(run.status)
    # Revocation is checked on its own, not only through the status: a key whose run
    # ended must never authenticate again, whatever later happens to the row.
    if run.key_revoked_at is not None:
        raise Unauthorized()
    return run


def error_response(exc: RunsError) -> JsonResponse:
    response = JsonResponse(exc.body(), status=exc.http_status)
    if isinstance(exc, MethodNotAllowed):
        response["Allow"] = ", ".join(exc.allowed)
    if isinstance(exc, RateLimited):
        response["Retry-After"] = str(exc.retry_after_s)
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
