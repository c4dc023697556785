"""manage.py cancel_run ID: cancel a live run (keys revoked, receipt sealed)."""

from __future__ import annotations

import uuid

from django.core.management.base import CommandError, CommandParser

from controlplane.commands import HoldfastCommand
from controlplane.runs import actions
from controlplane.runs.errors import RunNotFound
from controlplane.runs.models import Run


class Command(HoldfastCommand):
    help = "Cancel a live run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")

    def handle(self, *args: object, **options: object) -> None:
        try:
            run_id = uuid.UUID(str(options["run_id"]))
            claimed = actions.cancel_run(run_id)
        except (ValueError, RunNotFound):
            raise CommandError("no such run") from None
        status = Run.objects.values_list("status", flat=True).get(pk=run_id)
        self.stdout.write(f"cancelled {run_id}" if claimed else f"not cancelled: run {run_id} is already {status}")
