"""Admin sign-in is rate limited per client address (ADMIN_LOGIN_RATE_LIMIT attempts per
ADMIN_LOGIN_RATE_WINDOW_S); the excess is answered 429 with Retry-After."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from django.urls import NoReverseMatch, reverse

from controlplane import ratelimit


class AdminLoginRateLimit:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "POST" and request.path == _admin_login():
            retry = ratelimit.hit(
                "admin-login",
                ratelimit.client_address(request),
                limit=settings.ADMIN_LOGIN_RATE_LIMIT,
                window_s=settings.ADMIN_LOGIN_RATE_WINDOW_S,
            )
            if retry is not None:
                response = HttpResponse(
                    "Too many sign-in attempts; try again later.\n", status=429, content_type="text/plain"
                )
                response["Retry-After"] = str(retry)
                return response
        return self.get_response(request)


def _admin_login() -> str | None:
    """The admin's sign-in path, or None where this process serves no admin (the
    runner-api role)."""
    try:
        return reverse("admin:login")
    except NoReverseMatch:
        return None
