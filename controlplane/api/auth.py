"""Who is asking: ``Authorization: Bearer <API key>`` names an owner (owners/keys.py).

Rules (docs/api.md, "Authentication"):
- Every request is counted against its key before any database work
  (``API_RATE_PER_KEY`` per ``API_RATE_WINDOW_S``): one looping client cannot take the
  web process from everyone else.
- A missing, malformed, unknown, wrong, revoked or disabled key is one answer, 401 with
  ``WWW-Authenticate: Bearer``: the caller learns nothing about which.
- Failed authentications also count per client address, so guessing keys from one
  address stops at ``API_RATE_FAILED_PER_ADDRESS``.
- No session or cookie ever authenticates here: the admin's session must not let a
  page an operator visits call the API on their behalf.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest

from controlplane import ratelimit
from controlplane.owners import keys
from controlplane.owners.models import Owner

from .errors import RateLimited, Unauthenticated


def bearer(authorization: str) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def authenticate(authorization: str, client_address: str) -> Owner:
    """The owner the bearer key names; raises ``Unauthenticated`` or ``RateLimited``."""
    token = bearer(authorization)
    if token:
        retry = ratelimit.hit("api-key", token, limit=settings.API_RATE_PER_KEY, window_s=settings.API_RATE_WINDOW_S)
        if retry is not None:
            raise RateLimited(retry)
    key = keys.authenticate(token) if token else None
    if key is None:
        retry = ratelimit.hit(
            "api-addr-failed",
            client_address or "unknown",
            limit=settings.API_RATE_FAILED_PER_ADDRESS,
            window_s=settings.API_RATE_WINDOW_S,
        )
        if retry is not None:
            raise RateLimited(retry)
        raise Unauthenticated()
    return key.owner


def authenticate_request(request: HttpRequest) -> Owner:
    return authenticate(request.headers.get("Authorization", ""), ratelimit.client_address(request))
