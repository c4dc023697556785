"""Per-run credentials, derived rather than stored.

Every token is ``HMAC-SHA256(SECRET_KEY, [purpose, run id, discriminator, run salt])``:
the launch key (discriminator empty) and the session token (the runner instance id).
Deriving makes every issuing endpoint idempotent without
keeping a plaintext copy: a replay recomputes the same token, and the database holds
only its SHA-256. Presented tokens are compared as digests in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

from django.conf import settings

LAUNCH = "launch"
SESSION = "session"
# Prefixes make a leaked token recognisable to secret scanners and to the redactor.
_PREFIX = {LAUNCH: "hfl_", SESSION: "hfs_"}


def new_salt() -> str:
    return secrets.token_hex(16)


def derive(purpose: str, run_id: str, salt: str, discriminator: str = "") -> str:
    # A JSON list, not a joined string, so no choice of instance id or request key can
    # collide with another (purpose, run, key) triple.
    message = json.dumps([purpose, str(run_id), discriminator, salt]).encode()
    mac = hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()
    return _PREFIX[purpose] + mac


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def matches(presented: str, stored_hash: str) -> bool:
    """True when ``presented`` hashes to ``stored_hash``; an empty hash matches nothing."""
    if not stored_hash or not presented:
        return False
    return hmac.compare_digest(digest(presented), stored_hash)
