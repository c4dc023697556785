"""Test settings: the production parts (PostgreSQL, Redis), unless the environment says
otherwise. Each developer or CI job may point DATABASE_URL and CELERY_BROKER_URL at its
own database and Redis db number to run suites side by side."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/holdfast")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/9")
os.environ.setdefault("HOLDFAST_CACHE_URL", os.environ["CELERY_BROKER_URL"].rsplit("/", 1)[0] + "/10")
# The suite runs on PostgreSQL, which settings treat as a deploy: it needs its own key
# (shared with the web and worker processes tests start, since run keys derive from it)
# and serves plain HTTP on loopback, so cookies cannot be HTTPS-only.
os.environ.setdefault("DJANGO_SECRET_KEY", "holdfast-tests-only-key-3b1f0e9d7c5a4e2f8a6b0c1d9e7f5a3b")
os.environ.setdefault("HOLDFAST_SECURE_COOKIES", "0")

from controlplane.settings import *  # noqa: F403

# Test accounts are created and thrown away by the hundred; a slow hasher wastes minutes.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# One queue per test session: a message left over from an earlier, aborted run must
# never be picked up by this run's workers.
CELERY_TASK_DEFAULT_QUEUE = os.environ.setdefault("HOLDFAST_CELERY_QUEUE", f"holdfast-test-{os.getpid()}")
