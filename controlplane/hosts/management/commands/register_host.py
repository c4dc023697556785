"""``manage.py register_host NAME [--address ws://HOST:PORT]``: enter a host in the registry
(the same as adding it in the admin). NAME is the host's ``--host-id``."""

from __future__ import annotations

from controlplane.commands import HoldfastCommand
from controlplane.hosts import actions


class Command(HoldfastCommand):
    help = "Register a sandbox host (NAME is its --host-id; --address its direct ws:// URL)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--address", default="", help="direct ws:// URL of the host (not the balancer's)")
        parser.add_argument("--notes", default="")

    def handle(self, *args, name: str, address: str, notes: str, **options) -> None:
        row, created = actions.register(name, address=address, notes=notes)
        verb = "registered" if created else "updated"
        self.stdout.write(f"{verb} {row.name} state={row.state} address={row.address or '-'}")
