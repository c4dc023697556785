"""manage.py interrupt RUN: SIGINT to a live run's job (its process group). The job decides
what to do with it; an interrupt never kills a job that ignores it (cancel_run does)."""

from __future__ import annotations

from django.core.management.base import CommandParser

from controlplane.commands import HoldfastCommand
from controlplane.runs.models import SteerMessage

from .steer import send_from_command


class Command(HoldfastCommand):
    help = "Interrupt a live run's job (SIGINT to its process group)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")

    def handle(self, *args: object, **options: object) -> None:
        message = send_from_command(str(options["run_id"]), SteerMessage.Kind.INTERRUPT)
        self.stdout.write(message.id)
