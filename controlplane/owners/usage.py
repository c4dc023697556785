"""Per-owner figures for the operators' drain status page: executions running and
queued now, and submitted and finished in the last minute. Read from the executions
table only (four grouped, indexed counts), so the figures are the same whichever web
process serves the page."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.db.models import Count
from django.utils import timezone

# The rate window: "the last minute" of the issue; short enough to show a flood start.
RATE_WINDOW = timedelta(minutes=1)
# Owners listed, busiest first: the page is for seeing who loads the system, not a
# directory of every tenant.
MAX_OWNERS_SHOWN = 50


@dataclass
class OwnerUsage:
    name: str
    weight: int
    active: int = 0
    queued: int = 0
    submitted_last_minute: int = 0
    finished_last_minute: int = 0
    max_active: int = 0
    max_queued: int = 0


def by_owner(*, now: datetime | None = None) -> list[dict]:
    """Owners with work running, queued, or seen in the last minute, busiest first."""
    from controlplane.executions.models import Execution, Status
    from controlplane.owners.actions import caps
    from controlplane.owners.models import Owner

    now = now or timezone.now()
    since = now - RATE_WINDOW

    def grouped(rows) -> dict[str, int]:
        return dict(rows.values("owner").annotate(n=Count("pk")).values_list("owner", "n"))

    active = grouped(Execution.objects.filter(status=Status.RUNNING))
    queued = grouped(Execution.objects.filter(status=Status.QUEUED))
    submitted = grouped(Execution.objects.filter(created_at__gte=since))
    finished = grouped(Execution.objects.filter(finished_at__gte=since))
    names = set(active) | set(queued) | set(submitted) | set(finished)
    owners = {o.name: o for o in Owner.objects.filter(name__in=names)}
    views = []
    for name in names:
        owner = owners.get(name)
        limits = caps(owner) if owner is not None else None
        views.append(
            OwnerUsage(
                name=name,
                weight=owner.weight if owner is not None else 1,
                active=active.get(name, 0),
                queued=queued.get(name, 0),
                submitted_last_minute=submitted.get(name, 0),
                finished_last_minute=finished.get(name, 0),
                max_active=limits.max_active if limits else 0,
                max_queued=limits.max_queued if limits else 0,
            )
        )
    views.sort(key=lambda v: (-(v.active + v.queued), -v.finished_last_minute, v.name))
    return [asdict(v) for v in views[:MAX_OWNERS_SHOWN]]
