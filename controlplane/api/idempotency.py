"""``Idempotency-Key``: a retried creating POST gets the first one's resource.

The rule (docs/api.md, "Idempotency-Key"): within ``API_IDEMPOTENCY_RETENTION_S`` an
owner's key names at most one execution or run.

- The record and the resource are created in one transaction. The record's unique
  (owner, key) constraint is what serialises two concurrent requests with the same key:
  PostgreSQL makes the second INSERT wait for the first transaction, then fail; the
  loser reads the winner's record. So two racing retries create one resource.
- The same key with another route or another body is refused (422
  ``idempotency_key_reused``): answering it with the first resource would hide a bug in
  the client.
- A POST that was refused or failed leaves no record (the transaction rolled back):
  its retry tries again, as a retry after 429/503 must.
- A record past its retention is deleted when its key comes back (and by beat's purge),
  and the key then creates anew.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from .errors import IdempotencyKeyReused, InvalidField
from .models import IdempotencyRecord

# Rows one purge deletes at most: a short statement, repeated by the next tick.
PURGE_BATCH = 10_000


def parse_key(header: str | None) -> str | None:
    """The header's key, or None when absent; 400 when it is empty, too long or not
    printable ASCII (it is echoed in no answer, but stored and compared)."""
    if header is None:
        return None
    if not header or len(header) > settings.API_IDEMPOTENCY_KEY_MAX_CHARS or not all(" " < c <= "~" for c in header):
        raise InvalidField(
            f"must be 1 to {settings.API_IDEMPOTENCY_KEY_MAX_CHARS} printable ASCII characters",
            field="Idempotency-Key",
        )
    return header


def fingerprint(route: str, body: dict[str, Any]) -> str:
    canonical = json.dumps([route, body], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hmac.new(
        settings.SECRET_KEY.encode(), canonical.encode("utf-8", "surrogatepass"), hashlib.sha256
    ).hexdigest()


def _expired_before():
    return timezone.now() - timedelta(seconds=settings.API_IDEMPOTENCY_RETENTION_S)


def create_once(
    owner: str, key: str | None, route: str, body: dict[str, Any], create: Callable[[], uuid.UUID]
) -> tuple[uuid.UUID, bool]:
    """``create()`` once per (owner, key): returns (resource id, replayed)."""
    if key is None:
        with transaction.atomic():
            return create(), False
    digest = fingerprint(route, body)
    IdempotencyRecord.objects.filter(owner=owner, key=key, created_at__lt=_expired_before()).delete()
    try:
        with transaction.atomic():
            record = IdempotencyRecord.objects.create(
                owner=owner, key=key, route=route, fingerprint=digest, resource_id=uuid.uuid4()
            )
            resource_id = create()
            IdempotencyRecord.objects.filter(pk=record.pk).update(resource_id=resource_id)
    except IntegrityError:
        existing = IdempotencyRecord.objects.filter(owner=owner, key=key).first()
        if existing is None:  # the winner was purged in between: vanishingly rare; say so
            raise
        if existing.route != route or not hmac.compare_digest(existing.fingerprint, digest):
            raise IdempotencyKeyReused() from None
        return existing.resource_id, True
    return resource_id, False


def purge_expired() -> int:
    """Delete records past their retention, one batch; returns how many."""
    ids = list(
        IdempotencyRecord.objects.filter(created_at__lt=_expired_before()).values_list("pk", flat=True)[:PURGE_BATCH]
    )
    return IdempotencyRecord.objects.filter(pk__in=ids).delete()[0] if ids else 0
