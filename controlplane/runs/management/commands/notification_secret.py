"""manage.py notification_secret OWNER: print the secret OWNER's callback receiver
verifies progress notifications with (docs/operations.md, "Progress notifications")."""

from __future__ import annotations

from django.core.management.base import CommandParser

from controlplane.commands import HoldfastCommand
from controlplane.runs import notifications


class Command(HoldfastCommand):
    help = "Print an owner's notification signing secret (derived from HOLDFAST_NOTIFY_SIGNING_KEY)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("owner")

    def handle(self, *args: object, **options: object) -> None:
        self.stdout.write(notifications.owner_secret(str(options["owner"])))
