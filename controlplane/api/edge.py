"""The HTTP edge of the public API: one decorator every view goes through.

In order: the method is allowed (405), the key authenticates (401/429), the view runs;
every error the view or the actions below it raise is turned into the JSON error body
here, and nowhere else (errors.py). Views are CSRF exempt because they take no cookie:
a bearer key cannot ride along with a browser's request the way a session does.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane.owners.errors import OwnerError
from controlplane.owners.models import Owner
from controlplane.runs import errors as runs_errors

from . import errors
from .auth import authenticate_request

log = logging.getLogger("holdfast.api")

View = Callable[..., HttpResponse]


def translate(exc: Exception) -> HttpResponse | None:
    """The response for an error raised below the API, or None if it is not ours."""
    if isinstance(exc, errors.ApiError):
        return exc.response()
    if isinstance(exc, OwnerError):
        return errors.owner_error(exc)
    if isinstance(exc, runs_errors.RunNotFound):
        return errors.NotFound().response()
    if isinstance(exc, runs_errors.RunTerminal):
        return errors.RunTerminal(exc.status).response()
    if isinstance(exc, runs_errors.TooLarge):
        return errors.InvalidField(exc.message).response()
    if isinstance(exc, runs_errors.BadRequest):
        return errors.InvalidField(exc.message).response()
    return None


def endpoint(methods: tuple[str, ...]) -> Callable[[View], View]:
    def wrap(view: View) -> View:
        @csrf_exempt
        @functools.wraps(view)
        def handle(request: HttpRequest, **kwargs: str) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise errors.MethodNotAllowed(list(methods))
                owner = authenticate_request(request)
                return view(request, owner, **kwargs)
            except Exception as exc:
                response = translate(exc)
                if response is None:
                    raise
                return response

        return handle

    return wrap


def parse_id(raw: str) -> uuid.UUID:
    """A resource id from the path; anything that is not a UUID is simply not found."""
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise errors.NotFound() from None


def owned(model, raw_id: str, owner: Owner):
    """``model``'s row with this id if ``owner`` owns it; another owner's id is 404, the
    same as an id that does not exist (never 403, which would confirm it exists)."""
    row = model.objects.filter(pk=parse_id(raw_id), owner=owner.name).first()
    if row is None:
        raise errors.NotFound()
    return row
