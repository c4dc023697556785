"""Every Holdfast control-plane tunable, read from the environment in this one place.

Each setting carries its default and the reason for it. With nothing set, Holdfast runs
on its embedded default: SQLite and Celery's filesystem broker under ``var/``. Setting
``DATABASE_URL=postgres://...`` and ``CELERY_BROKER_URL=redis://...`` switches to the
production parts; the code is the same on both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

from holdfast_wire import protocol as _protocol

BASE_DIR = Path(__file__).resolve().parent.parent
# Embedded state (SQLite file, filesystem broker, file cache) lives here, never in the
# source tree proper, so `git clean` and `.gitignore` keep it out of commits.
VAR_DIR = Path(os.environ.get("HOLDFAST_VAR_DIR", BASE_DIR / "var"))


# Messages about settings that start-up must say loudly but that do not stop it (a max
# age below 1 s falls back to the default). settings.py runs before logging exists, so
# they are printed to stderr here and logged again once logging is up
# (controlplane.executions.apps).
STARTUP_WARNINGS: list[str] = []


def _refuse(name: str, raw: str, expected: str) -> ImproperlyConfigured:
    # Quoted and bounded: the value is an operator's typo, never a secret we parse.
    return ImproperlyConfigured(f"{name}={raw[:80]!r} is not valid: expected {expected}")


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    word = raw.strip().lower()
    if word not in TRUE_WORDS | FALSE_WORDS:
        raise _refuse(name, raw, "one of 1/true/yes/on or 0/false/no/off")
    return word in TRUE_WORDS


def env_float(name: str, default: float, *, minimum: float | None = None, below_minimum: str = "refuse") -> float:
    """Parse a number strictly. Anything that is not a finite number stops start-up
    with ImproperlyConfigured naming the variable: a half-applied typo (``90s`` running
    as the default 120) breaks promises sized on the value, with no signal. A value
    below ``minimum`` is refused too, unless ``below_minimum="default"``: then it falls
    back to the default and says so loudly at start-up."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    expected = "a number" + (f" >= {minimum:g}" if minimum is not None else "") + " (plain digits, no unit)"
    try:
        value = float(raw.strip())
    except ValueError:
        raise _refuse(name, raw, expected) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise _refuse(name, raw, expected)
    if minimum is not None and value < minimum:
        if below_minimum != "default":
            raise _refuse(name, raw, expected)
        message = f"{name}={raw.strip()} is below {minimum:g}: running with the default {default:g} instead"
        STARTUP_WARNINGS.append(message)
        print(f"holdfast settings WARNING: {message}", file=sys.stderr)
        return default
    return value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    expected = "a whole number" + (f" >= {minimum}" if minimum is not None else "") + " (plain digits, no unit)"
    try:
        value = int(raw.strip())
    except ValueError:
        raise _refuse(name, raw, expected) from None
    if minimum is not None and value < minimum:
        raise _refuse(name, raw, expected)
    return value


def database_from_url(url: str) -> dict:
    """``postgres://user:pass@host:port/name?sslmode=...`` or ``sqlite:///path``."""
    parsed = urlparse(url)
    if parsed.scheme in {"postgres", "postgresql", "pgsql"}:
        options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")) or "holdfast",
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            "OPTIONS": options,
            # Executions are short and workers are threads: reuse connections for a
            # minute rather than opening one per task.
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    if parsed.scheme == "sqlite":
        return _sqlite(Path(unquote(parsed.path)) if parsed.path else VAR_DIR / "holdfast.sqlite3")
    raise _refuse("DATABASE_URL", f"{parsed.scheme}://...", "postgres://user:pass@host:port/name or sqlite:///path")


def _sqlite(path: Path) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            # Several processes (web, worker, the main job) share one file: WAL lets readers
            # and one writer proceed together, IMMEDIATE takes the write lock at BEGIN so two
            # writers queue on the busy timeout instead of failing with "database is locked".
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        },
    }


# --- Django core -------------------------------------------------------------------

# A fixed key only for the embedded default (long and varied enough that `check
# --deploy` accepts it on one machine); anything else must set DJANGO_SECRET_KEY, and
# is refused below if it does not. Run keys and session tokens are HMACs of this key
# (controlplane/runs/credentials.py): see docs/operations.md before rotating it.
EMBEDDED_SECRET_KEY = "holdfast-embedded-default-NOT-for-production-7f3a9c1e5b2d8046"  # noqa: S105
SECRET_KEY = env_str("DJANGO_SECRET_KEY", EMBEDDED_SECRET_KEY)
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver").split(",") if h]
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1", "testserver"})

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "controlplane.executions",
    "controlplane.runs",
    "controlplane.hosts",
    "controlplane.owners",
    "controlplane.api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "controlplane.ratelimit_middleware.AdminLoginRateLimit",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# What this web process serves: "all" (the admin, the runner API and the public API
# under /api/v1/), or "runner-api"
# (only the runner API: the process HOLDFAST_CONTROL_PLANE_URL should name, since a
# run's relay carries its job to whatever that address serves; controlplane/runner_urls.py).
WEB_ROLES = {"all": "controlplane.urls", "runner-api": "controlplane.runner_urls"}
WEB_ROLE = env_str("HOLDFAST_WEB_ROLE", "all")
if WEB_ROLE not in WEB_ROLES:
    raise ImproperlyConfigured(f"HOLDFAST_WEB_ROLE must be one of {', '.join(WEB_ROLES)}; got {WEB_ROLE!r}")
ROOT_URLCONF = WEB_ROLES[WEB_ROLE]
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "controlplane" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL", "")
DATABASES = {"default": database_from_url(DATABASE_URL) if DATABASE_URL else _sqlite(VAR_DIR / "holdfast.sqlite3")}

# The embedded default: one machine, SQLite, served on loopback (or DEBUG). Anything
# else (a PostgreSQL DATABASE_URL, or DEBUG off with a non-local host) is a deploy.
EMBEDDED = DATABASES["default"]["ENGINE"].endswith("sqlite3") and (DEBUG or set(ALLOWED_HOSTS) <= LOCAL_HOSTS)
if not EMBEDDED and SECRET_KEY == EMBEDDED_SECRET_KEY:
    # Everyone can read the built-in key: with it, anyone could mint run keys and sessions.
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is not set, and this is not the embedded default (a PostgreSQL DATABASE_URL, "
        "or DJANGO_DEBUG off with a non-local DJANGO_ALLOWED_HOSTS): refusing the built-in key. Generate one with "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'` (docs/operations.md)"
    )

# `manage.py check --deploy` runs clean (the Procfile's web line runs it first).
# Cookies only over HTTPS in a deploy: the admin session is what an attacker wants.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("HOLDFAST_SECURE_COOKIES", not EMBEDDED)
# HSTS (seconds) in a deploy: browsers then refuse plain HTTP to the admin for a year.
SECURE_HSTS_SECONDS = env_int("HOLDFAST_HSTS_SECONDS", 0 if EMBEDDED else 365 * 24 * 3600, minimum=0)
# Redirecting HTTP to HTTPS is the balancer's job for browsers; runners reach the
# internal API over the sandbox relay, which may be plain HTTP on a private address.
SECURE_SSL_REDIRECT = env_bool("HOLDFAST_SSL_REDIRECT", False)
# Behind a TLS balancer that sets X-Forwarded-Proto, Django must believe it, or it
# treats every request as HTTP (secure cookies, CSRF origin checks).
if env_bool("HOLDFAST_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SILENCED_SYSTEM_CHECKS = [
    # W008 (no SSL redirect): see SECURE_SSL_REDIRECT above; HOLDFAST_SSL_REDIRECT=1 where
    # every client speaks HTTPS.
    "security.W008",
    # W005/W021 (HSTS for subdomains, preload): a decision about the operator's whole
    # domain, not Holdfast's to make.
    "security.W005",
    "security.W021",
]
if EMBEDDED:
    # The embedded default serves loopback over plain HTTP: secure cookies and HSTS
    # would lock its own admin out.
    SILENCED_SYSTEM_CHECKS += ["security.W004", "security.W012", "security.W016"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis in production (shared by every worker, so the drain page sees them all); the
# file cache under var/ on the embedded default, since it needs no extra process.
CACHE_URL = env_str("HOLDFAST_CACHE_URL", "")
if CACHE_URL.startswith("redis://"):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            # JSON, never pickle: a process that can write a key on this Redis must not
            # run code in the workers and the web process that read it (controlplane/cache.py).
            "OPTIONS": {"serializer": "controlplane.cache.JsonSerializer"},
        }
    }
else:
    CACHES = {
        "default": {
            # Django's file cache, storing JSON instead of pickles (controlplane/cache.py).
            "BACKEND": "controlplane.cache.JsonFileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # One logfmt line per record, fields passed as data (holdfast_wire.logfmt): the same
    # style the sandbox host writes.
    "formatters": {"logfmt": {"()": "holdfast_wire.logfmt.LogfmtFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "logfmt"}},
    "root": {"handlers": ["stderr"], "level": env_str("HOLDFAST_LOG_LEVEL", "INFO")},
}

# --- Celery --------------------------------------------------------------------------

# The filesystem transport ignores the host; naming one keeps kombu from warning on
# every publish that it "reverts to localhost" (noise on every command's stderr).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://localhost/")
_BROKER_DIR = VAR_DIR / "broker"
# Executions are stored on their rows; Celery's result backend would be a second copy.
CELERY_TASK_IGNORE_RESULT = True
# Late acknowledgement: a message is acked only after its task returns, so a worker that
# dies mid-task has its message redelivered instead of lost. Redelivery cannot run an
# execution twice because the task claims the row by compare-and-set (queued -> running)
# before anything is sent to a host.
CELERY_TASK_ACKS_LATE = True
# A worker killed mid-task must not requeue forever ("message loops" in Celery's docs):
# the claimed row already says the execution may have run, and the sweep marks it.
CELERY_TASK_REJECT_ON_WORKER_LOST = False
# Celery's Django fixup closes the database connection before and after every task
# unless told to reuse it, which left CONN_MAX_AGE a dead letter in workers: each task
# opened a new PostgreSQL connection (a backend process: about 8 ms here, more than the
# claim's own queries). The fixup never closes it now; controlplane/celery.py closes what
# Django closes after a request instead (past CONN_MAX_AGE, unusable, or left inside a
# transaction), and the task's first query health-checks a kept connection
# (CONN_HEALTH_CHECKS), so one the server dropped is replaced, not used.
CELERY_DB_REUSE_MAX = sys.maxsize
# Prefetch 1: a worker holds only the messages it is running, so on a warm shutdown
# nothing sits reserved in a dying process and a scale-in hands work to the survivors.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# The longest execution we accept, in seconds. The broker's visibility timeout must be
# longer than any task, or Redis redelivers a message whose task is still running.
EXECUTION_MAX_TIMEOUT_S = env_float("HOLDFAST_EXECUTION_MAX_TIMEOUT_S", 300.0, minimum=1.0)
# Visibility timeout = the longest execution + the pool's wait for a connection + margin,
# rounded up generously: a long value only delays recovery after a power loss, a short
# one duplicates deliveries (the CAS claim makes a duplicate harmless, but wasteful).
CELERY_VISIBILITY_TIMEOUT_S = env_int("HOLDFAST_CELERY_VISIBILITY_TIMEOUT_S", 3600, minimum=60)
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport with atomic writes and claims (controlplane/broker.py).
    CELERY_BROKER_TRANSPORT = "controlplane.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "queue"),
        "data_folder_out": str(_BROKER_DIR / "queue"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        # Broadcast (remote control) files; kombu's default is ./control in the cwd.
        "control_folder": str(_BROKER_DIR / "control"),
        "store_processed": False,
        # The filesystem transport polls; a tenth of a second keeps the main job snappy.
        "polling_interval": 0.1,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_VISIBILITY_TIMEOUT_S}
# Warm shutdown on SIGTERM (Celery's default) finishes running tasks; the soft-shutdown
# window bounds it so it fits the orchestrator's grace (Kubernetes: 30 s by default).
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = env_float("HOLDFAST_WORKER_SOFT_SHUTDOWN_S", 0.0, minimum=0.0)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_DEFAULT_QUEUE = env_str("HOLDFAST_CELERY_QUEUE", "holdfast")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Seconds between two reconcile ticks (controlplane/runs/reconcile.py). 30 s finds a lost
# sandbox within grace + one interval, for one probe round trip per host per tick.
RECONCILE_INTERVAL_S = env_float("HOLDFAST_RECONCILE_INTERVAL_S", 30.0, minimum=1.0)
CELERY_BEAT_SCHEDULE = {
    # A crash between commit and publish loses the message; re-publishing rows still
    # queued is harmless because the task claims by compare-and-set.
    "executions-sweep": {"task": "controlplane.executions.tasks.sweep_executions", "schedule": 30.0},
    # Overlapping ticks (two beats by mistake, a slow tick) are harmless: every write a
    # tick makes compare-and-sets against what it read. A tick message older than one
    # interval is dropped: the next one does the same work with fresher rows.
    "runs-reconcile": {
        "task": "controlplane.runs.tasks.reconcile_runs",
        "schedule": RECONCILE_INTERVAL_S,
        "options": {"expires": RECONCILE_INTERVAL_S},
    },
    # Idempotency records past their retention are deleted in small batches; a
    # replay after that creates anew (docs/api.md, "Idempotency-Key").
    "api-idempotency-purge": {"task": "controlplane.api.tasks.purge_idempotency_records", "schedule": 600.0},
}


def _ensure_embedded_dirs() -> None:
    """The embedded default must work from a fresh clone whichever process starts first
    (the Procfile's web migrates, its worker lists the broker queue, ``manage.py execute``
    opens the database): create what it keeps under ``var/`` here, the one place every
    process passes through. The production parts need no directory."""
    needed = []
    if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        needed.append(Path(DATABASES["default"]["NAME"]).parent)
    if CELERY_BROKER_URL.startswith("filesystem://"):
        needed += [_BROKER_DIR / "queue", _BROKER_DIR / "processed", _BROKER_DIR / "control"]
    for path in needed:
        path.mkdir(parents=True, exist_ok=True)


_ensure_embedded_dirs()

# --- Sandbox pool (per worker process) ------------------------------------------------

# Where the pool dials: a load balancer in front of hosts, or one host. Unset means the
# pool is not configured, and an execution fails at once with a configuration error.
SANDBOX_URL = env_str("HOLDFAST_SANDBOX_URL", "")
# Shared secret every host checks on the first frame. Never logged, never sent to a child.
SANDBOX_TOKEN = env_str("HOLDFAST_SANDBOX_TOKEN", "")
# The least containment a host must report in auth_ok before the pool or the launch
# driver sends it anything: by default the full sandbox ("bwrap"). A host below it is
# refused with the reason in the execution's error. Lower it only on a developer
# machine, knowingly: insecure-shared-uid or insecure-rlimits (docs/operations.md).
# Lowered, `check --deploy` (the Procfile's web line) fails: controlplane/hosts/checks.py.
SANDBOX_FULL_ISOLATION = _protocol.FULL_ISOLATION
SANDBOX_REQUIRED_ISOLATION = env_str("HOLDFAST_REQUIRED_ISOLATION", SANDBOX_FULL_ISOLATION)
if SANDBOX_REQUIRED_ISOLATION not in _protocol.ISOLATION_LEVELS:
    raise ImproperlyConfigured(
        f"HOLDFAST_REQUIRED_ISOLATION must be one of {', '.join(_protocol.ISOLATION_LEVELS)}; "
        f"got {SANDBOX_REQUIRED_ISOLATION!r}"
    )
# PEM bundle of the CA(s) that sign the hosts' certificates, for wss:// URLs (hosts run
# with --tls-cert/--tls-key, or a TLS balancer in front of them). Empty: the system's
# CAs. Verification (certificate and host name) is never off: the token and launch keys
# cross this wire, and the token grants code execution.
SANDBOX_CA_BUNDLE = env_str("HOLDFAST_SANDBOX_CA_BUNDLE", "")
if SANDBOX_CA_BUNDLE and not Path(SANDBOX_CA_BUNDLE).is_file():
    raise _refuse("HOLDFAST_SANDBOX_CA_BUNDLE", SANDBOX_CA_BUNDLE, "the path of a readable PEM file")
# Max age of one connection (seconds), jittered down by up to 20% per connection. After
# it a connection takes no new work, finishes what it runs and closes, so a host that a
# balancer deregistered drains before its deregistration delay ends. Below 1 s is a
# typo, not a wish: it falls back to the default, said loudly at start-up (the seed's rule).
SANDBOX_CONNECTION_MAX_AGE_S = env_float("HOLDFAST_CONNECTION_MAX_AGE_S", 120.0, minimum=1.0, below_minimum="default")
# Jitter spreads retirements so a worker's connections do not all reconnect at once;
# downward only, so the max age stays an upper bound the balancer can be sized against.
SANDBOX_CONNECTION_MAX_AGE_JITTER = 0.2
# Executions sharing one connection. The host runs each in its own child process, so
# this bounds the fan-in per socket, not CPU (the host has its own admission limit).
SANDBOX_PER_CONNECTION_LIMIT = env_int("HOLDFAST_PER_CONNECTION_LIMIT", 8, minimum=1)
# Connections per worker process. With the limit above this caps executions in flight.
SANDBOX_MAX_CONNECTIONS = env_int("HOLDFAST_MAX_CONNECTIONS", 8, minimum=1)
# How long an execution waits for a free slot before failing "at capacity".
SANDBOX_ACQUIRE_TIMEOUT_S = env_float("HOLDFAST_ACQUIRE_TIMEOUT_S", 30.0, minimum=0.0)
# TCP connect + WebSocket handshake + authentication, per attempt.
SANDBOX_CONNECT_TIMEOUT_S = env_float("HOLDFAST_CONNECT_TIMEOUT_S", 10.0, minimum=0.1)
# An execution whose connection was closing before it was sent never left the worker;
# it moves to another connection at most this many times (DESIGN.md: 3).
SANDBOX_MAX_MOVES = 3
# The pool's own backstop over the host's timeout: the host kills the child at the
# timeout and answers; this covers a host that never answers at all.
SANDBOX_RESULT_GRACE_S = env_float("HOLDFAST_RESULT_GRACE_S", 10.0, minimum=1.0)

# --- Executions ----------------------------------------------------------------------

EXECUTION_DEFAULT_TIMEOUT_S = env_float("HOLDFAST_EXECUTION_TIMEOUT_S", 10.0, minimum=0.1)
# 256 MiB is enough for ordinary Python and small data; a hog hits MemoryError quickly.
EXECUTION_DEFAULT_MEMORY_MB = env_int("HOLDFAST_EXECUTION_MEMORY_MB", 256, minimum=32)
# Largest snippet accepted (bytes). The host bounds frames too; refusing here is clearer.
EXECUTION_MAX_CODE_BYTES = env_int("HOLDFAST_EXECUTION_MAX_CODE_BYTES", 256 * 1024, minimum=1024)
# A row still 'running' this long after its timeout lost its worker (SIGKILL, power):
# the sweep marks it interrupted. It may have run, so it is never re-sent.
EXECUTION_STALE_GRACE_S = env_float("HOLDFAST_EXECUTION_STALE_GRACE_S", 120.0, minimum=10.0)
# A row still 'queued' this long had its message lost (crash between commit and
# publish): the sweep publishes it again; the CAS claim makes a duplicate harmless.
EXECUTION_REQUEUE_AFTER_S = env_float("HOLDFAST_EXECUTION_REQUEUE_AFTER_S", 60.0, minimum=5.0)
# How long an outcome the database could not take is kept in the broker and retried
# (store_outcome) before it is given up as lost, in seconds. A database outage of several
# minutes (a failover, a restart, a network partition) must lose no result; half an hour
# covers an operator's repair. Each retry is a new message held well inside the broker's
# visibility timeout, so this may exceed it.
EXECUTION_RESULT_STORE_PATIENCE_S = env_float("HOLDFAST_EXECUTION_RESULT_STORE_PATIENCE_S", 1800.0, minimum=1.0)
# ``manage.py execute`` gives up on an execution no worker claimed within this many
# seconds (it cancels the row, so it cannot run later with nobody listening) and says
# that no worker is running: one clear line instead of a silent minute-long wait.
# On PostgreSQL, a stored result is announced with NOTIFY and execute() waits for that
# instead of polling the row (controlplane/executions/notify.py). Off only to compare, or
# where a pooler (PgBouncer in transaction mode) cannot carry LISTEN.
EXECUTION_RESULT_NOTIFY = env_bool("HOLDFAST_EXECUTION_RESULT_NOTIFY", True)
EXECUTION_PICKUP_WAIT_S = env_float("HOLDFAST_EXECUTION_PICKUP_WAIT_S", 30.0, minimum=1.0)
# Per-owner caps; an owner's own value (admin, create_owner) overrides these.
# 200 active and 2,000 queued are the reference service's figures: enough for a busy
# tenant, small enough that one tenant cannot take the whole fleet or bury the queue.
OWNER_MAX_ACTIVE = env_int("HOLDFAST_OWNER_MAX_ACTIVE", 200, minimum=1)
OWNER_MAX_QUEUED = env_int("HOLDFAST_OWNER_MAX_QUEUED", 2000, minimum=1)
OWNER_MAX_LIVE_RUNS = env_int("HOLDFAST_OWNER_MAX_LIVE_RUNS", 50, minimum=1)
# The whole deployment's capacity: executions queued across all owners. Beyond it every
# submission is refused with at_capacity (503), whoever asks: 10,000 waiting rows is the
# reference service's figure and already minutes of work for a fleet; a caller arriving
# behind more would wait longer than execute() waits (its timeout + 60 s). Counted
# without a global lock, so concurrent submits of different owners may pass it by at
# most one each (docs/operations.md).
EXECUTION_MAX_QUEUED_TOTAL = env_int("HOLDFAST_MAX_QUEUED_TOTAL", 10_000, minimum=1)
# Seconds an execution may wait queued. Older, it is never run: it fails with the
# queue_wait_exceeded text. 300 s is the reference service's figure; nobody still waits
# for a snippet queued five minutes ago (execute() gives up at timeout + 60 s).
EXECUTION_MAX_QUEUE_WAIT_S = env_float("HOLDFAST_EXECUTION_MAX_QUEUE_WAIT_S", 300.0, minimum=1.0)

# --- Runs ----------------------------------------------------------------------------

# Where a runner inside a sandbox reaches this control plane's internal API: the
# Procfile's runner-api process (port 8001), or the balancer in front of it. Passed to
# the host at launch, never guessed by the runner. Not the web process: a run's relay
# carries its job to this address, and web also serves the admin and the public API.
RUNS_CONTROL_PLANE_URL = env_str("HOLDFAST_CONTROL_PLANE_URL", "http://127.0.0.1:8001")
# Dotted path of the callable that builds the launch driver (controlplane.runs.launcher).
# Empty means the sandbox hosts' WebSocket driver when HOLDFAST_SANDBOX_URL and _TOKEN
# are set (the same hosts executions use); with neither, runs cannot be launched: the
# task retries, then fails the run clearly.
RUNS_LAUNCH_DRIVER = env_str("HOLDFAST_RUNS_LAUNCH_DRIVER", "")
# Seconds a host has to answer launch_run once asked (connect and authentication have
# SANDBOX_CONNECT_TIMEOUT_S). A launch copies the runner and starts one process: well
# under a second; 30 s covers a host on a loaded machine. A launch unanswered in time
# may have started: the task retries, which the host's idempotency makes safe.
RUNS_LAUNCH_REPLY_TIMEOUT_S = env_float("HOLDFAST_RUNS_LAUNCH_REPLY_TIMEOUT_S", 30.0, minimum=1.0)
# Attempts to hand a claimed run to a host. Every attempt is safe to repeat because the
# host launches at most one sandbox per run id; the cap only bounds a host-less outage.
RUNS_LAUNCH_MAX_ATTEMPTS = env_int("HOLDFAST_RUNS_LAUNCH_MAX_ATTEMPTS", 5, minimum=1)
# Seconds between launch attempts (doubled per attempt): hosts restart in seconds.
RUNS_LAUNCH_RETRY_DELAY_S = env_float("HOLDFAST_RUNS_LAUNCH_RETRY_DELAY_S", 5.0, minimum=0.0)
# A job's wall-clock limit (seconds) when it names none, and the most it may ask for.
RUNS_DEFAULT_TIMEOUT_S = env_int("HOLDFAST_RUNS_DEFAULT_TIMEOUT_S", 3600, minimum=1)
RUNS_MAX_TIMEOUT_S = env_int("HOLDFAST_RUNS_MAX_TIMEOUT_S", 24 * 3600, minimum=1)
# Events per batch. The runner sends at most 50; ten times that leaves room for an older
# or newer runner without letting one request hold the run's lock for long.
RUNS_MAX_EVENTS_PER_BATCH = env_int("HOLDFAST_RUNS_MAX_EVENTS_PER_BATCH", 500, minimum=1)
# Bytes of one events body. The runner caps a batch near 900 KiB after redaction.
RUNS_MAX_EVENTS_BODY_BYTES = env_int("HOLDFAST_RUNS_MAX_EVENTS_BODY_BYTES", 1024 * 1024, minimum=1024)
# Rate limits on the runner API, per window of this many seconds (Django's cache counts).
# Per run key: a runner sends at most ~10 event batches a second plus its polls; 600 in
# 10 s is six times that, so only a runaway or hostile loop meets it. Per client address,
# failed authentications only: every runner of a host arrives through that host's relay,
# so one job guessing keys must not spend its neighbours' budget; it stops a flood of
# made-up keys from one address. Answered 429 with Retry-After.
RUNS_API_RATE_WINDOW_S = env_float("HOLDFAST_RUNS_API_RATE_WINDOW_S", 10.0, minimum=1.0)
RUNS_API_RATE_PER_KEY = env_int("HOLDFAST_RUNS_API_RATE_PER_KEY", 600, minimum=1)
RUNS_API_RATE_PER_ADDRESS = env_int("HOLDFAST_RUNS_API_RATE_PER_ADDRESS", 20_000, minimum=1)
# Admin sign-in attempts (POSTs to the login page) per client address per window: enough
# for typos, far too few to guess a password.
ADMIN_LOGIN_RATE_LIMIT = env_int("HOLDFAST_ADMIN_LOGIN_RATE_LIMIT", 10, minimum=1)
ADMIN_LOGIN_RATE_WINDOW_S = env_float("HOLDFAST_ADMIN_LOGIN_RATE_WINDOW_S", 300.0, minimum=1.0)
# Events one run may store. A run may stream for a day; without a quota one chatty or
# hostile job fills the database. 100,000 events (a line every second for a day and some)
# then one events_truncated event; later batches are refused with 409 events_truncated.
RUNS_MAX_EVENTS_PER_RUN = env_int("HOLDFAST_RUNS_MAX_EVENTS_PER_RUN", 100_000, minimum=1)
# Bytes of one event's data (encoded JSON). The runner cuts an output line at 64 KiB;
# JSON escaping may double it; beyond this the event is not output but abuse, and the
# run's events are truncated as above.
RUNS_MAX_EVENT_BYTES = env_int("HOLDFAST_RUNS_MAX_EVENT_BYTES", 256 * 1024, minimum=1024)
# Bytes of the small JSON body of hello and of a result (its summary).
RUNS_MAX_SMALL_BODY_BYTES = 16 * 1024
RUNS_MAX_RESULT_BODY_BYTES = env_int("HOLDFAST_RUNS_MAX_RESULT_BODY_BYTES", 256 * 1024, minimum=1024)
# Characters of a run's error text kept on the row (after redaction): a diagnosis, not a log.
RUNS_MAX_ERROR_CHARS = 4000

# --- Reconcile (controlplane/runs/reconcile.py) ----------------------------------------

# Seconds a sandbox must stay exited or unknown on its host before its run fails as
# sandbox_lost. One probe never fails a run: it may race a host restart or a result in
# flight. 90 s is three default ticks: a host restart (seconds) is long over by then.
SANDBOX_LOSS_GRACE_S = env_float("HOLDFAST_SANDBOX_LOSS_GRACE_S", 90.0, minimum=0.0)
# A loss stamp more than this far in the future (seconds; clocks of two machines) is
# not trusted: it is replaced by now, never taken as proof.
RECONCILE_CLOCK_SKEW_S = 5.0
# Seconds one host has to answer a tick's probe (after connect and authentication,
# which have SANDBOX_CONNECT_TIMEOUT_S). A host answers 1000 ids in milliseconds; a
# host that does not answer in time leaves its runs untouched this tick.
RECONCILE_PROBE_TIMEOUT_S = env_float("HOLDFAST_RECONCILE_PROBE_TIMEOUT_S", 10.0, minimum=0.5)
# Seconds a run may stay queued (since creation) or provisioning without a runner's
# hello (since its claim) before reconcile republishes its launch once, and as long
# again before it fails as launch_lost. Longer than the launch task's own retries
# (RUNS_LAUNCH_MAX_ATTEMPTS with doubling delays, each up to a connect and a reply
# timeout: about 5 minutes at the defaults), so a launch still being retried is not
# relaunched under it.
RUN_LAUNCH_DEADLINE_S = env_float("HOLDFAST_RUN_LAUNCH_DEADLINE_S", 600.0, minimum=1.0)
# Seconds past a running job's own timeout before reconcile stops its sandbox and fails
# it as deadline_exceeded. The runner kills its job at the timeout and reports; the
# margin covers the kill grace and a result delivered through an outage (the runner's
# result budget is 300 s). Only a runner whose timer died with it gets here.
RUN_DEADLINE_MARGIN_S = env_float("HOLDFAST_RUN_DEADLINE_MARGIN_S", 600.0, minimum=0.0)

# --- Outbound progress notifications (controlplane/runs/notifications.py) ---------------

# The key each owner's notification secret is derived from (HMAC-SHA256 of the owner's
# name): rotating it rotates every owner's secret. Defaults to the Django secret key so
# the embedded default works; production sets its own.
NOTIFY_SIGNING_KEY = env_str("HOLDFAST_NOTIFY_SIGNING_KEY", SECRET_KEY)
# Seconds one POST to a callback URL may take (connect + answer): a receiver that needs
# longer should queue and answer 202.
NOTIFY_TIMEOUT_S = env_float("HOLDFAST_NOTIFY_TIMEOUT_S", 10.0, minimum=0.5)
# Attempts per notification before it is abandoned (kept on its row, visible in the
# admin). With the backoff below the last one goes out about 40 minutes after the first.
NOTIFY_MAX_ATTEMPTS = env_int("HOLDFAST_NOTIFY_MAX_ATTEMPTS", 8, minimum=1)
# First retry delay (seconds), doubled per attempt with full jitter, capped at 15 min: a
# receiver restarting is back in seconds, one that is down stays unhammered.
NOTIFY_RETRY_BASE_S = env_float("HOLDFAST_NOTIFY_RETRY_BASE_S", 5.0, minimum=0.0)
NOTIFY_RETRY_MAX_S = 15 * 60.0
# A notification never attempted this long after its claim lost its Celery message (a
# crash between commit and publish): reconcile publishes it again. Far longer than any
# queue backlog, so a message merely waiting in the queue is not doubled for nothing.
NOTIFY_REPUBLISH_AFTER_S = env_float("HOLDFAST_NOTIFY_REPUBLISH_AFTER_S", 3600.0, minimum=60.0)
# Callback URLs must be http or https; this bounds their length on the row.
NOTIFY_MAX_URL_CHARS = 2000

# --- Steering (runs/steering.py, runs/steer_asgi.py, docs/runner-api.md "steer") ------

# Bytes of one steering message's body: a prompt or an instruction, not a file.
RUNS_STEER_MAX_BODY_BYTES = env_int("HOLDFAST_RUNS_STEER_MAX_BODY_BYTES", 16 * 1024, minimum=256)
# Ids one poll may acknowledge (the seed's STEER_ACK_MAX): the runner acks at most what
# one batch served it; a bound keeps one request from marking a run's whole backlog.
RUNS_STEER_ACK_MAX = 32
# Messages one poll serves, oldest first. Below the ack bound, so every message a batch
# served can be acknowledged on the next poll.
RUNS_STEER_BATCH_MAX = 16
# Seconds a long poll stays parked waiting for a message (PostgreSQL only). Well under
# the runner's 60 s read timeout and a balancer's usual 60 s idle timeout.
RUNS_STEER_LONG_POLL_S = env_float("HOLDFAST_RUNS_STEER_LONG_POLL_S", 20.0, minimum=1.0)
# Seconds the runner pauses between two empty polls where no long poll is possible (the
# embedded SQLite default has no notifications): an interrupt lands within about this.
RUNS_STEER_SHORT_POLL_S = env_float("HOLDFAST_RUNS_STEER_SHORT_POLL_S", 1.0, minimum=0.1)
# Parked polls one web process holds; beyond it a poll is answered at once as a short
# poll, so a flood cannot exhaust the process's sockets or memory (docs/operations.md).
RUNS_STEER_MAX_PARKED = env_int("HOLDFAST_RUNS_STEER_MAX_PARKED", 5000, minimum=1)

# --- Operations (the host registry, the drain page, drain_host) -----------------------

# Seconds between two snapshots a worker process publishes to the cache (its pool's
# connections per host) and between two reads of the operator drains. 2 s keeps the page
# and a drain current for the cost of one cache write and a few queries per worker.
HOSTS_SNAPSHOT_INTERVAL_S = env_float("HOLDFAST_HOSTS_SNAPSHOT_INTERVAL_S", 2.0, minimum=0.2)
# A snapshot lives this many intervals: one missed publish is tolerated, a dead worker
# disappears from the page within seconds instead of lying about its connections.
HOSTS_SNAPSHOT_TTL_INTERVALS = 3
# Window (seconds) of the "finished in the last minutes" column.
HOSTS_FINISHED_WINDOW_S = env_float("HOLDFAST_HOSTS_FINISHED_WINDOW_S", 300.0, minimum=10.0)
# A draining host that no worker has held a connection to for this long is gone. Several
# publish intervals, so one late worker cannot make a host that still serves look gone.
HOSTS_GONE_AFTER_S = env_float("HOLDFAST_HOSTS_GONE_AFTER_S", 30.0, minimum=1.0)
# drain_host gives up (exit 1) after this many seconds. An operator drain retires
# connections at once, so what remains is the longest execution plus the pool's grace.
HOSTS_DRAIN_TIMEOUT_S = env_float(
    "HOLDFAST_DRAIN_TIMEOUT_S", EXECUTION_MAX_TIMEOUT_S + SANDBOX_RESULT_GRACE_S + 30.0, minimum=1.0
)
# How often the drain page fetches fresh figures (seconds).
HOSTS_PAGE_REFRESH_S = env_float("HOLDFAST_HOSTS_PAGE_REFRESH_S", 2.0, minimum=0.5)

# --- The public API (controlplane/api/, docs/api.md) ------------------------------------

# Bytes of one request body. A snippet may be EXECUTION_MAX_CODE_BYTES and JSON escaping
# can double it; anything beyond is refused (413) before it is read.
API_MAX_BODY_BYTES = env_int("HOLDFAST_API_MAX_BODY_BYTES", 2 * EXECUTION_MAX_CODE_BYTES + 16 * 1024, minimum=1024)
# Seconds POST /executions with "wait": true blocks for a result before answering 202
# (the caller then polls). It holds one web thread while it waits, so it is bounded well
# under a balancer's usual 60 s idle timeout.
API_EXECUTION_WAIT_MAX_S = env_float("HOLDFAST_API_EXECUTION_WAIT_MAX_S", 30.0, minimum=0.1)
# Seconds an Idempotency-Key is remembered per owner. A day covers any client's retry
# loop (and an outage); after it the same key creates anew. Purged by beat.
API_IDEMPOTENCY_RETENTION_S = env_float("HOLDFAST_API_IDEMPOTENCY_RETENTION_S", 24 * 3600.0, minimum=60.0)
# Characters of an Idempotency-Key (a UUID is 36; room for a client's own scheme).
API_IDEMPOTENCY_KEY_MAX_CHARS = 255
# Rate limits per API key, per window of this many seconds (Django's cache counts, so
# every web process counts together): 300 requests in 10 s is a busy service polling
# hundreds of executions; beyond it the key is looped or abused. Failed authentications
# count per client address, so a flood of made-up keys stops there. Answered 429.
API_RATE_WINDOW_S = env_float("HOLDFAST_API_RATE_WINDOW_S", 10.0, minimum=1.0)
API_RATE_PER_KEY = env_int("HOLDFAST_API_RATE_PER_KEY", 300, minimum=1)
API_RATE_FAILED_PER_ADDRESS = env_int("HOLDFAST_API_RATE_FAILED_PER_ADDRESS", 100, minimum=1)
# Events one GET /runs/{id}/events page returns at most (the default page is 100).
API_EVENTS_PAGE_MAX = env_int("HOLDFAST_API_EVENTS_PAGE_MAX", 500, minimum=1)
# The server-sent-events stream (controlplane/api/sse.py): a stream lives at most this
# many seconds, then ends and the client reconnects with Last-Event-ID (no stream holds
# a socket forever, and a deploy's old process lets go within it).
API_SSE_MAX_S = env_float("HOLDFAST_API_SSE_MAX_S", 300.0, minimum=1.0)
# Seconds between two reads of a streamed run's new events where they are not announced
# (SQLite, or while the process's LISTEN connection reconnects); a read is one indexed
# query in a shared executor thread, and the stream holds no thread in between.
API_SSE_POLL_S = env_float("HOLDFAST_API_SSE_POLL_S", 0.5, minimum=0.05)
# Where stored events are announced (PostgreSQL NOTIFY), a stream reads when woken and
# otherwise only this often: a safety net for a notification lost, not the way events
# arrive. A thousand quiet streams cost a read every few milliseconds, not 2,000 a second.
API_SSE_SAFETY_POLL_S = env_float("HOLDFAST_API_SSE_SAFETY_POLL_S", 5.0, minimum=0.05)
# Seconds between two keep-alive comments on a quiet stream: under a balancer's usual
# 60 s idle timeout.
API_SSE_HEARTBEAT_S = env_float("HOLDFAST_API_SSE_HEARTBEAT_S", 15.0, minimum=1.0)
# Streams one web process serves at once; beyond it a stream is refused 503 with
# Retry-After, so a flood of streams cannot exhaust the process (each is a socket and a
# poll loop).
API_SSE_MAX_STREAMS = env_int("HOLDFAST_API_SSE_MAX_STREAMS", 1000, minimum=1)
# Of those, the streams one owner may hold at once (429 owner_limit beyond): one owner's
# flood of streams cannot take every slot of the process from the others.
API_SSE_MAX_STREAMS_PER_OWNER = env_int("HOLDFAST_API_SSE_MAX_STREAMS_PER_OWNER", 100, minimum=1)
