"""``manage.py execute --code '...'`` (or ``--file``): run a snippet through the full path
and exit with its exit status."""

from __future__ import annotations

import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

from controlplane.commands import HoldfastCommand

# Exit codes for outcomes that have no exit status of their own, after coreutils'
# timeout(1) and sysexits.h, so shell scripts can tell them apart.
EXIT_TIMED_OUT = 124
EXIT_CANCELLED = 130
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: it may have run; look before retrying
EXIT_SYSTEM = 70  # EX_SOFTWARE
DEFAULT_OWNER = "cli"


class Command(HoldfastCommand):
    help = "Execute a Python snippet in a sandbox and print its output."

    def add_arguments(self, parser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--code", help="the snippet")
        source.add_argument("--file", help="a file holding the snippet ('-' for stdin)")
        # Without --owner the operator's own owner "cli" is used (and created); a named
        # owner must exist and be active.
        parser.add_argument("--owner", default=None)
        parser.add_argument("--timeout", type=float, default=None, help="seconds")
        parser.add_argument("--memory", type=int, default=None, help="MiB")
        parser.add_argument(
            "--pickup-wait",
            type=float,
            default=settings.EXECUTION_PICKUP_WAIT_S,
            help="seconds to wait for a worker to claim the execution before cancelling it",
        )

    def handle(self, *args, **options) -> None:
        from controlplane.executions.api import execute
        from controlplane.owners.actions import ensure

        owner = options["owner"]
        if owner is None:
            owner = ensure(DEFAULT_OWNER).name

        if options["code"] is not None:
            code = options["code"]
        elif options["file"] == "-":
            code = sys.stdin.read()
        else:
            try:
                code = Path(options["file"]).read_text()
            except OSError as exc:
                raise CommandError(f"cannot read {options['file']}: {exc.strerror}") from None
        try:
            result = execute(
                code,
                owner=owner,
                timeout_s=options["timeout"],
                memory_mb=options["memory"],
                pickup_wait_s=options["pickup_wait"],
            )
        except ValueError as exc:  # bad input, and OwnerError (unknown, disabled, over a cap)
            raise CommandError(str(exc)) from None
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if (result.error and result.status != "failed") or (result.status == "failed" and result.exit_code is None):
            sys.stderr.write(f"holdfast: {result.status}: {result.error}\n")
        sys.stdout.flush()
        sys.stderr.flush()
        if result.status in {"succeeded", "failed"} and result.exit_code is not None:
            sys.exit(result.exit_code)
        sys.exit(
            {"timed_out": EXIT_TIMED_OUT, "cancelled": EXIT_CANCELLED, "interrupted": EXIT_INTERRUPTED}.get(
                result.status, EXIT_SYSTEM
            )
        )
