"""``manage.py demo``: Holdfast's main job on whatever database and broker are configured
(the embedded default when nothing is set). It starts a sandbox host and a Celery worker,
runs a few snippets through the full path (row -> task -> pool -> host -> child) and
prints what came back."""

from __future__ import annotations

import secrets
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from controlplane.commands import HoldfastCommand

SNIPPETS: list[tuple[str, str, dict, str]] = [
    ("hello", "print('hello from a sandbox')", {}, "succeeded"),
    ("arithmetic", "import math\nprint(sum(math.isqrt(n) for n in range(10_000)))", {}, "succeeded"),
    ("user error", "def f():\n    raise ValueError('bad input')\nf()", {}, "failed"),
    ("stderr", "import sys\nprint('to stderr', file=sys.stderr)\nsys.exit(3)", {}, "failed"),
    ("busy loop", "while True:\n    pass", {"timeout_s": 1.0}, "timed_out"),
    ("memory hog", "x = bytearray(1024 * 1024 * 1024)", {"memory_mb": 128}, "failed"),
]


class Command(HoldfastCommand):
    help = "Start a sandbox host and a worker, run a few snippets through the full path, print the results."

    def handle(self, *args, **options) -> None:
        from controlplane.executions.api import execute
        from controlplane.owners.actions import ensure
        from holdfast_devtools import processes

        for folder in ("queue", "processed", "control"):
            (settings.VAR_DIR / "broker" / folder).mkdir(parents=True, exist_ok=True)
        call_command("migrate", verbosity=0, interactive=False)
        ensure("demo")  # every execution belongs to an owner (docs/operations.md)
        db = settings.DATABASES["default"]
        self.stdout.write(f"database: {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}")
        self.stdout.write(f"broker:   {settings.CELERY_BROKER_URL}")
        token = secrets.token_urlsafe(32)
        try:
            host = processes.start_host(token, host_id="demo-host")
        except RuntimeError as exc:
            # A host that cannot build its sandbox says why in its last line: show that,
            # not a traceback (e.g. "bubblewrap is not installed (... apt-get install ...)").
            raise CommandError(str(exc).strip().splitlines()[-1]) from None
        self.stdout.write(f"host:     {processes.host_url(host)}")
        worker = None
        failures = 0
        try:
            worker = processes.start_worker(
                {"HOLDFAST_SANDBOX_URL": processes.host_url(host), "HOLDFAST_SANDBOX_TOKEN": token}, concurrency=4
            )
            self.stdout.write("worker:   ready\n")
            for name, code, limits, expected in SNIPPETS:
                started = time.monotonic()
                result = execute(code, owner="demo", **limits)
                took = time.monotonic() - started
                mark = "ok " if result.status == expected else "BAD"
                failures += result.status != expected
                self.stdout.write(
                    f"[{mark}] {name:<11} status={result.status:<9} exit={result.exit_code} ({took:.2f}s)"
                )
                for label, text in (("stdout", result.stdout), ("stderr", result.stderr), ("error", result.error)):
                    text = text.strip()
                    if text:
                        self.stdout.write(f"      {label}: {text.splitlines()[-1][:100]}")
        finally:
            if worker is not None:
                worker.stop()
            host.stop()
            if failures:
                for child in (worker, host):
                    if child is not None:
                        self.stderr.write(f"--- last lines of {child.name} ---\n" + "\n".join(child.lines[-40:]))
        total = len(SNIPPETS)
        self.stdout.write(f"\n{total - failures} of {total} snippets ended as expected")
        if failures:
            raise CommandError(f"{failures} snippet(s) did not end as expected")
