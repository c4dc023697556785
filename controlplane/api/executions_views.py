"""``/api/v1/executions``: submit, read, cancel. Thin: parse, then call the executions
API (executions/api.py) and actions, as ``execute()`` callers do."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from controlplane.executions import actions, api
from controlplane.executions.models import Execution
from controlplane.owners.models import Owner

from . import idempotency, representations, waiting
from .edge import endpoint, owned
from .parsing import BOOLEAN, INTEGER, NUMBER, STRING, Field, json_body

ROUTE = "POST /executions"
# The sandbox's memory bounds (executions/actions.py create).
MEMORY_MB_RANGE = (32, 16384)


def _code(value: str) -> str | None:
    if not value.strip():
        return "must not be empty"
    if len(value.encode()) > settings.EXECUTION_MAX_CODE_BYTES:
        return f"must be at most {settings.EXECUTION_MAX_CODE_BYTES} bytes"
    return None


def _timeout(value: float) -> str | None:
    if not 0 < value <= settings.EXECUTION_MAX_TIMEOUT_S:
        return f"must be more than 0 and at most {settings.EXECUTION_MAX_TIMEOUT_S:g}"
    return None


def _memory(value: int) -> str | None:
    low, high = MEMORY_MB_RANGE
    return None if low <= value <= high else f"must be from {low} to {high}"


FIELDS = {
    "code": Field(STRING, required=True, check=_code),
    "timeout_s": Field(NUMBER, check=_timeout),
    "memory_mb": Field(INTEGER, check=_memory),
    "wait": Field(BOOLEAN),
}


def _answer(row: Execution, *, status: int, replayed: bool = False) -> JsonResponse:
    response = JsonResponse(representations.execution(row), status=status)
    response["Location"] = f"/api/v1/executions/{row.pk}"
    if replayed:
        response["Idempotent-Replayed"] = "true"
    return response


@endpoint(("POST",))
def create(request: HttpRequest, owner: Owner) -> JsonResponse:
    key = idempotency.parse_key(request.headers.get("Idempotency-Key"))
    body = json_body(request, FIELDS)
    # Whether to wait is how this call answers, not what it creates: a retry may change it.
    wait = body.pop("wait", False)
    execution_id, replayed = idempotency.create_once(
        owner.name,
        key,
        ROUTE,
        body,
        lambda: api.submit(
            body["code"], owner=owner.name, timeout_s=body.get("timeout_s"), memory_mb=body.get("memory_mb")
        ),
    )
    if wait:
        row = waiting.wait_for(execution_id, settings.API_EXECUTION_WAIT_MAX_S)
        return _answer(row, status=200 if row.is_terminal else 202, replayed=replayed)
    return _answer(Execution.objects.get(pk=execution_id), status=202, replayed=replayed)


@endpoint(("GET",))
def detail(request: HttpRequest, owner: Owner, execution_id: str) -> JsonResponse:
    return JsonResponse(representations.execution(owned(Execution, execution_id, owner)))


@endpoint(("POST",))
def cancel(request: HttpRequest, owner: Owner, execution_id: str) -> JsonResponse:
    """Cancel a queued execution outright or ask its worker to stop a running one; a
    finished one is left as it is. Safe to repeat: the answer is the execution after."""
    row = owned(Execution, execution_id, owner)
    actions.request_cancel(str(row.pk))
    row.refresh_from_db()
    return JsonResponse(representations.execution(row))
