"""Outbound progress notifications: a signed POST to a run's callback URL on every
terminal transition.

Rules (DESIGN.md, Reconcile; docs/operations.md, "Progress notifications"):
- Only the claimer of a terminal transition notifies: ``record`` runs inside
  ``actions._finish``'s transaction, after the claim landed, so a lost claim sends
  nothing. The row is unique by (run, status): a notification exists at most once.
- The task (``tasks.deliver_notification``) takes the row's id. It leases the row
  before it POSTs, so a redelivered message does not send it while the first send is
  in flight, and it marks the row delivered by compare-and-set, so a 2xx ends it for
  good. A non-2xx or a network failure is retried with full-jitter exponential backoff
  up to ``NOTIFY_MAX_ATTEMPTS``; the receiver dedupes on ``Holdfast-Notification-Id``.
- The body is signed with HMAC-SHA256 under the owner's notification secret, which is
  derived from ``NOTIFY_SIGNING_KEY`` and the owner's name (``owner_secret``;
  ``manage.py notification_secret OWNER`` prints it for the owner's receiver)::

      Holdfast-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>

  The timestamp inside the MAC lets a receiver refuse replays older than it allows.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlparse

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from holdfast_wire.logfmt import fields

from . import dispatch
from .errors import BadRequest

log = logging.getLogger("holdfast.runs")

SIGNATURE_HEADER = "Holdfast-Signature"
ID_HEADER = "Holdfast-Notification-Id"
USER_AGENT = "holdfast-notify/1"


def validate_callback_url(url: str) -> str:
    url = (url or "").strip()
    if not url:
        return ""
    parsed = urlparse(url)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname or len(url) > settings.NOTIFY_MAX_URL_CHARS:
        raise BadRequest(f"callback_url must be an http(s) URL of at most {settings.NOTIFY_MAX_URL_CHARS} characters")
    return url


def owner_secret(owner: str) -> str:
    """The secret an owner's receiver verifies notifications with (hex)."""
    key = settings.NOTIFY_SIGNING_KEY.encode()
    return hmac.new(key, b"holdfast-notify-v1:" + owner.encode(), hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does (Python); docs/operations.md shows the same."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        timestamp = int(parts.get("t", ""))
    except ValueError:
        return False
    return hmac.compare_digest(sign(secret, body, timestamp), f"t={timestamp},v1={parts.get('v1', '')}")


def record(run) -> None:
    """Inside the claimer's transaction: write the notification for the run's new
    status (once) and send it after commit. Nothing when the run has no callback."""
    from .models import RunNotification

    if not run.callback_url:
        return
    notification, created = RunNotification.objects.get_or_create(
        run=run, status=run.status, defaults={"url": run.callback_url}
    )
    if created:
        dispatch.enqueue_notification_on_commit(notification.id)


def body_of(notification) -> bytes:
    run = notification.run
    payload = {
        "notification_id": notification_key(notification),
        "run_id": str(run.id),
        "owner": run.owner,
        "status": notification.status,
        "exit_code": run.exit_code,
        "error": run.error,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def notification_key(notification) -> str:
    return f"{notification.run_id}:{notification.status}"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer that is not 2xx: urllib would turn the POST into a GET to
    wherever the receiver points, without the body the signature covers."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


# No proxies from the environment either: the callback goes where the run said.
_OPENER = urllib.request.build_opener(_NoRedirects(), urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Attempt:
    """What one delivery attempt did: ``retry_in_s`` is set when another is due."""

    sent: bool
    delivered: bool
    retry_in_s: float | None = None


def retry_delay_s(attempt: int) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))], floored at 1 s."""
    ceiling = min(settings.NOTIFY_RETRY_MAX_S, settings.NOTIFY_RETRY_BASE_S * 2 ** max(0, attempt - 1))
    return max(min(1.0, ceiling), random.uniform(0, ceiling))


def deliver(notification_id: int) -> Attempt:
    """One attempt. Leases the row first (compare-and-set): a second sender for the same
    row (a redelivered message) finds it leased or delivered and sends nothing."""
    from .models import RunNotification

    now = timezone.now()
    lease = timedelta(seconds=settings.NOTIFY_TIMEOUT_S + 5)
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    leased = (
        RunNotification.objects.filter(pk=notification_id, delivered_at__isnull=True, abandoned_at__isnull=True)
        .filter(free)
        .update(lease_until=now + lease)
    )
    if not leased:
        return Attempt(sent=False, delivered=False)
    notification = RunNotification.objects.select_related("run").get(pk=notification_id)
    body = body_of(notification)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        ID_HEADER: notification_key(notification),
        SIGNATURE_HEADER: sign(owner_secret(notification.run.owner), body, int(time.time())),
    }
    error = ""
    try:
        request = urllib.request.Request(notification.url, data=body, headers=headers, method="POST")  # noqa: S310
        with _OPENER.open(request, timeout=settings.NOTIFY_TIMEOUT_S) as answer:
            answer.read(64 * 1024)
            ok = 200 <= answer.status < 300
            error = "" if ok else f"HTTP {answer.status}"
    except urllib.error.HTTPError as exc:
        ok, error = False, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        # The class only: a foreign message may quote the URL's credentials.
        ok, error = False, type(exc).__name__
    attempts = notification.attempts + 1
    if ok:
        RunNotification.objects.filter(pk=notification_id, delivered_at__isnull=True).update(
            delivered_at=timezone.now(), attempts=attempts, lease_until=None, last_error=""
        )
        log.info(
            "run_notified", extra=fields(run_id=notification.run_id, status=notification.status, attempts=attempts)
        )
        return Attempt(sent=True, delivered=True)
    if attempts >= settings.NOTIFY_MAX_ATTEMPTS:
        RunNotification.objects.filter(pk=notification_id).update(
            attempts=attempts, lease_until=None, last_error=error, abandoned_at=timezone.now()
        )
        log.warning("run_notify_abandoned", extra=fields(run_id=notification.run_id, attempts=attempts, error=error))
        return Attempt(sent=True, delivered=False)
    RunNotification.objects.filter(pk=notification_id).update(attempts=attempts, lease_until=None, last_error=error)
    log.info("run_notify_retry", extra=fields(run_id=notification.run_id, attempts=attempts, error=error))
    return Attempt(sent=True, delivered=False, retry_in_s=retry_delay_s(attempts))
