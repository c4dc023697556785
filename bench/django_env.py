"""Django set up for a bench script, on whatever database and broker the environment
names (the embedded default if none)."""

from __future__ import annotations

import os
import secrets


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    # On PostgreSQL the settings refuse the built-in key (docs/operations.md, "Secrets").
    # Nothing a bench signs outlives it, so a key of its own per run serves; set in the
    # environment, so the host and worker it starts share it.
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-" + secrets.token_hex(16))
    import django

    django.setup()
