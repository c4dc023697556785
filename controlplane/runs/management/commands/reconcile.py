"""manage.py reconcile --once: run one reconcile tick now and print what it saw and did.

The same action the beat task runs (controlplane/runs/reconcile.py), so running it next
to a beat is harmless: every write compare-and-sets against what its tick read.
"""

from __future__ import annotations

from django.core.management.base import CommandError, CommandParser

from controlplane.commands import HoldfastCommand
from controlplane.runs import reconcile


class Command(HoldfastCommand):
    help = "Run one reconcile tick (probe hosts, apply deadlines) and print a report."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one tick and exit (the only mode)")
        parser.add_argument("--verbose-ids", action="store_true", help="also list the run ids acted on")

    def handle(self, *args: object, **options: object) -> None:
        if not options["once"]:
            raise CommandError("pass --once (ticks are scheduled by Celery beat: HOLDFAST_RECONCILE_INTERVAL_S)")
        report = reconcile.tick()
        for line in report.lines():
            self.stdout.write(line)
        if options["verbose_ids"]:
            for what, ids in (
                ("stamped", report.stamped),
                ("cleared", report.cleared),
                ("relaunched", report.relaunched),
                *((f"failed {reason}", ids) for reason, ids in report.failed.items()),
            ):
                for run_id in ids:
                    self.stdout.write(f"{what} {run_id}")
