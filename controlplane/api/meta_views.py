"""The API's description of itself (docs/openapi.json), and its JSON 404."""

from __future__ import annotations

import functools
import json

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .errors import MethodNotAllowed, NotFound

OPENAPI_PATH = settings.BASE_DIR / "docs" / "openapi.json"


@functools.cache
def description() -> dict:
    return json.loads(OPENAPI_PATH.read_text())


def openapi(request: HttpRequest) -> HttpResponse:
    """Public, like docs/: it says what the API takes, nothing about anyone's data."""
    if request.method != "GET":
        return MethodNotAllowed(["GET"]).response()
    return JsonResponse(description())


@csrf_exempt
def not_found(request: HttpRequest) -> HttpResponse:
    return NotFound("no such route").response()
