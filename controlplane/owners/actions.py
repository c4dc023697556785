"""Owners as the rest of the control plane sees them: look one up by name (refusing an
unknown or disabled one), and read its effective caps."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from controlplane.owners.errors import OwnerDisabled, UnknownOwner
from controlplane.owners.models import Owner


@dataclass(frozen=True)
class Caps:
    max_active: int
    max_queued: int
    max_live_runs: int


def resolve(name: str) -> Owner:
    """The active owner called ``name``; raises UnknownOwner or OwnerDisabled."""
    owner = Owner.objects.filter(name=name).first() if isinstance(name, str) and name else None
    if owner is None:
        raise UnknownOwner(str(name))
    if not owner.is_active:
        raise OwnerDisabled(owner.name)
    return owner


def caps(owner: Owner) -> Caps:
    return Caps(
        max_active=owner.max_active if owner.max_active is not None else settings.OWNER_MAX_ACTIVE,
        max_queued=owner.max_queued if owner.max_queued is not None else settings.OWNER_MAX_QUEUED,
        max_live_runs=owner.max_live_runs if owner.max_live_runs is not None else settings.OWNER_MAX_LIVE_RUNS,
    )


def ensure(name: str, **fields) -> Owner:
    """The owner called ``name``, created with ``fields`` if missing (the demos and
    operator commands use it; services get owners from an operator)."""
    owner, _ = Owner.objects.get_or_create(name=name, defaults=fields)
    return owner
