"""API keys: ``hf_<prefix>_<secret>``. The prefix finds the row; only a SHA-256 digest
of the whole key is stored (the secret has 256 bits of entropy, so a slow password hash
would buy nothing), compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.owners.models import ApiKey, Owner

SCHEME = "hf"
# last_used_at is a hint for operators, not an audit log: written at most this often
# per key, so a busy key does not cost a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_key(owner: Owner, label: str = "") -> tuple[ApiKey, str]:
    """A new key for ``owner``: the row, and the key itself (shown once, never stored)."""
    prefix = secrets.token_hex(6)
    raw = f"{SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(owner=owner, label=label[:100], prefix=prefix, digest=_digest(raw))
    return key, raw


def parse_prefix(raw: str) -> str | None:
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != SCHEME or not parts[1] or not parts[2]:
        return None
    return parts[1][:16]


def authenticate(raw: str) -> ApiKey | None:
    """The live key ``raw`` names, with its owner, or None: malformed, unknown, wrong
    secret, revoked, or its owner disabled all look alike to the caller."""
    prefix = parse_prefix(raw or "")
    if prefix is None:
        return None
    key = ApiKey.objects.select_related("owner").filter(prefix=prefix).first()
    if key is None or not hmac.compare_digest(key.digest, _digest(raw)):
        return None
    if key.revoked_at is not None or not key.owner.is_active:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def revoke(key: ApiKey) -> bool:
    """Revoke once; True if this call revoked it."""
    with transaction.atomic():
        return bool(ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()))
