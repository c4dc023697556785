"""manage.py show_run ID: a run's status, result and events in order (secrets never shown)."""

from __future__ import annotations

import json
import uuid

from django.core.management.base import CommandError, CommandParser

from controlplane.commands import HoldfastCommand
from controlplane.runs.models import Receipt, Run
from controlplane.runs.receipts import verify_receipt


class Command(HoldfastCommand):
    help = "Show a run: status, result, receipt and events in order."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")

    def handle(self, *args: object, **options: object) -> None:
        try:
            run = Run.objects.get(pk=uuid.UUID(str(options["run_id"])))
        except (ValueError, Run.DoesNotExist):
            raise CommandError("no such run") from None
        out = self.stdout
        out.write(f"run       {run.id}")
        out.write(f"owner     {run.owner}")
        out.write(f"status    {run.status}")
        out.write(f"job       {run.job.get('kind')} timeout={run.job.get('timeout_s')}s")
        if run.host_id:
            out.write(f"host      {run.host_id}")
        if run.loss_observed_at and not run.is_terminal:
            out.write(f"loss      sandbox seen exited or unknown since {run.loss_observed_at.isoformat()}")
        if run.is_terminal:
            out.write(f"exit_code {run.exit_code}")
            if run.error:
                out.write(f"error     {run.error}")
            out.write(f"summary   {json.dumps(run.summary, sort_keys=True)}")
        receipt = Receipt.objects.filter(run=run).first()
        if receipt is not None:
            state = "verified" if verify_receipt(receipt) else "BROKEN"
            out.write(f"receipt   {receipt.sha256} ({state}, #{receipt.chain_index} of {receipt.owner})")
        for note in run.notifications.order_by("id"):
            state = "delivered" if note.delivered_at else "abandoned" if note.abandoned_at else "pending"
            out.write(f"notified  {note.status}: {state} after {note.attempts} attempt(s)")
        out.write("events")
        for event in run.events.order_by("seq").iterator():
            out.write(f"  {event.seq:>6} {event.ts.isoformat()} {event.type} {json.dumps(event.data, sort_keys=True)}")
