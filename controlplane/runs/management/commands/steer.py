"""manage.py steer RUN "text": send a live run's job a steering message (a JSON line on its stdin)."""

from __future__ import annotations

import uuid

from django.core.management.base import CommandError, CommandParser

from controlplane.commands import HoldfastCommand
from controlplane.runs import steering
from controlplane.runs.errors import RunNotFound, RunsError, RunTerminal
from controlplane.runs.models import SteerMessage


def send_from_command(run_id: str, kind: str, body: str = "") -> SteerMessage:
    try:
        return steering.send(uuid.UUID(run_id), kind, body)
    except (ValueError, RunNotFound):
        raise CommandError("no such run") from None
    except RunTerminal as exc:
        raise CommandError(f"refused: run {run_id} has already ended ({exc.status}); nothing was sent") from None
    except RunsError as exc:
        raise CommandError(f"refused: {exc.message}") from None


class Command(HoldfastCommand):
    help = "Send a live run's job a steering message."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("text")

    def handle(self, *args: object, **options: object) -> None:
        message = send_from_command(str(options["run_id"]), SteerMessage.Kind.STEER, str(options["text"]))
        self.stdout.write(message.id)
