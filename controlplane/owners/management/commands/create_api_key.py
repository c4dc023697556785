"""manage.py create_api_key OWNER [--label TEXT]: prints the key once."""

from __future__ import annotations

from django.core.management.base import CommandError

from controlplane.commands import HoldfastCommand
from controlplane.owners import keys
from controlplane.owners.models import Owner


class Command(HoldfastCommand):
    help = "Create an API key for an owner and print it (only its digest is stored)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("owner")
        parser.add_argument("--label", default="")

    def handle(self, *args, owner: str, label: str, **options) -> None:
        row = Owner.objects.filter(name=owner).first()
        if row is None:
            raise CommandError(f"unknown owner {owner!r}: create it with `manage.py create_owner {owner}`")
        _, raw = keys.create_key(row, label=label)
        # The key alone on stdout, so `KEY=$(manage.py create_api_key acme)` works.
        self.stdout.write(raw)
