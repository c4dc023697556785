"""manage.py create_owner NAME [--weight W] [--max-active N] [--max-queued N] [--max-live-runs N]"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from controlplane.commands import HoldfastCommand
from controlplane.owners.models import Owner


class Command(HoldfastCommand):
    help = "Create an owner (or update an existing one's weight and caps)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--weight", type=int, default=None)
        parser.add_argument("--max-active", type=int, default=None)
        parser.add_argument("--max-queued", type=int, default=None)
        parser.add_argument("--max-live-runs", type=int, default=None)
        parser.add_argument("--disable", action="store_true", help="refuse the owner's new work")

    def handle(self, *args, name: str, **options) -> None:
        owner = Owner.objects.filter(name=name).first()
        created = owner is None
        owner = owner or Owner(name=name)
        for field in ("weight", "max_active", "max_queued", "max_live_runs"):
            if options[field] is not None:
                setattr(owner, field, options[field])
        owner.is_active = not options["disable"]
        try:
            owner.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from None
        owner.save()
        self.stdout.write(f"{'created' if created else 'updated'} owner {owner.name} (weight {owner.weight})")
