"""State changes of SandboxHost rows (STYLE habit 5: views and commands call these).

Every transition is a compare-and-set on the state the caller read, so several workers
observing the same host at once, and an operator acting meanwhile, cannot undo each
other: the first writer wins and the others update nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from controlplane.hosts.models import DrainSource, SandboxHost, State
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.hosts")

HOST_DRAINING_REASON = "host draining"  # what the pool records when a host sends `draining`


def register(name: str, *, address: str = "", notes: str = "") -> tuple[SandboxHost, bool]:
    """Create the row for ``name`` (or update its address). Returns (row, created)."""
    row, created = SandboxHost.objects.get_or_create(name=name, defaults={"address": address, "notes": notes})
    if not created and address and row.address != address:
        SandboxHost.objects.filter(pk=row.pk).update(address=address)
        row.address = address
    return row, created


def drain(row: SandboxHost, *, source: str = DrainSource.OPERATOR, now: datetime | None = None) -> bool:
    """active|gone -> draining. An operator drain of a host that already drains on its
    own takes it over (so it sticks); its start time is kept. Returns whether it changed."""
    now = now or timezone.now()
    if source == DrainSource.OPERATOR:
        # Taking over a drain the host started keeps its start time; anything else starts now.
        changed = (
            SandboxHost.objects.filter(pk=row.pk, state=State.DRAINING)
            .exclude(drained_by=DrainSource.OPERATOR)
            .update(drained_by=DrainSource.OPERATOR)
        )
        changed += (
            SandboxHost.objects.filter(pk=row.pk)
            .exclude(state=State.DRAINING)
            .update(state=State.DRAINING, drained_by=DrainSource.OPERATOR, drain_started_at=now)
        )
    else:
        changed = SandboxHost.objects.filter(pk=row.pk, state=State.ACTIVE).update(
            state=State.DRAINING, drained_by=source, drain_started_at=now
        )
    if changed:
        row.refresh_from_db()
        log.info(
            "drain_started",
            extra=fields(
                host=row.name,
                host_id=row.reported_id,
                source=source,
                started_at=row.drain_started_at.isoformat() if row.drain_started_at else "",
            ),
        )
    return bool(changed)


def activate(row: SandboxHost, *, reason: str) -> bool:
    """draining|gone -> active (an operator ends a drain, or the host came back)."""
    changed = (
        SandboxHost.objects.filter(pk=row.pk, state=row.state, drained_by=row.drained_by)
        .exclude(state=State.ACTIVE)
        .update(state=State.ACTIVE, drained_by=DrainSource.NONE, drain_started_at=None)
    )
    if changed:
        log.info("host_active", extra=fields(host=row.name, host_id=row.reported_id, reason=reason))
    return bool(changed)


def operator_drains() -> tuple[set[str], set[str]]:
    """Host ids and direct URLs every pool must retire and stop dialing."""
    rows = SandboxHost.objects.filter(drained_by=DrainSource.OPERATOR, state__in=[State.DRAINING, State.GONE])
    ids, urls = set(), set()
    for row in rows.only("name", "host_id", "address"):
        ids.add(row.reported_id)
        if row.address:
            urls.add(row.address)
    return ids, urls


def observe(worker: str, hosts: dict[str, dict], *, now: datetime | None = None) -> None:
    """Record what one worker's pool sees: which hosts it holds connections to (last
    seen, auto-registration), which told it they are draining, which came back."""
    now = now or timezone.now()
    held = {h for h, item in hosts.items() if item["connections"] > 0}
    said_draining = {
        h
        for h, item in hosts.items()
        if HOST_DRAINING_REASON in item["retire_reasons"] and item["youngest_open_age_s"] is None
    }
    ids = held | said_draining
    if not ids:
        return
    by_id: dict[str, SandboxHost] = {}
    for row in SandboxHost.objects.filter(Q(host_id__in=ids) | Q(name__in=ids)):
        by_id.setdefault(row.reported_id, row)
    for host_id in sorted(held - by_id.keys()):
        by_id[host_id] = _auto_register(host_id, worker, hosts[host_id]["urls"])
    seen_pks = [by_id[h].pk for h in held if h in by_id]
    SandboxHost.objects.filter(pk__in=seen_pks).update(last_seen_at=now)
    for host_id in held:
        level = hosts[host_id].get("isolation") or ""
        if level and host_id in by_id and by_id[host_id].isolation != level:
            SandboxHost.objects.filter(pk=by_id[host_id].pk).update(isolation=level)
    # The convention: a row entered by name learns its reported id on first sight.
    SandboxHost.objects.filter(pk__in=seen_pks, host_id="").exclude(name="").update(host_id=F("name"))
    for host_id in said_draining:
        row = by_id.get(host_id)
        if row is not None and row.state == State.ACTIVE:
            drain(row, source=DrainSource.HOST, now=now)
    for host_id in held - said_draining:
        row = by_id[host_id]
        youngest = hosts[host_id]["youngest_open_age_s"]
        if youngest is None or row.state == State.ACTIVE or row.drained_by == DrainSource.OPERATOR:
            continue
        # A draining host answers every new connection "draining", so an open connection
        # opened after the drain began means a new host process under the same id.
        opened_at = now - timedelta(seconds=youngest)
        if row.drain_started_at is None or opened_at > row.drain_started_at:
            activate(row, reason="a worker opened a fresh connection to it")


def sweep_gone(*, now: datetime | None = None) -> int:
    """draining -> gone once no worker has held a connection to it for a while."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.HOSTS_GONE_AFTER_S)
    gone = 0
    candidates = SandboxHost.objects.filter(state=State.DRAINING, drain_started_at__lt=cutoff).filter(
        Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=cutoff)
    )
    for row in candidates:
        # Compare-and-set on last_seen_at: a worker that just saw the host wins.
        if SandboxHost.objects.filter(pk=row.pk, state=State.DRAINING, last_seen_at=row.last_seen_at).update(
            state=State.GONE
        ):
            gone += 1
            log.info(
                "host_gone",
                extra=fields(
                    host=row.name,
                    host_id=row.reported_id,
                    source=row.drained_by or "-",
                    drain_s=round((now - row.drain_started_at).total_seconds() if row.drain_started_at else 0.0, 1),
                ),
            )
    return gone


def _auto_register(host_id: str, worker: str, urls: list[str]) -> SandboxHost:
    try:
        with transaction.atomic():
            return SandboxHost.objects.create(
                name=host_id[:64],
                host_id=host_id[:64],
                notes=f"Registered automatically: {worker} connected to it via {', '.join(urls) or '?'}.",
            )
    except IntegrityError:  # another worker registered it first
        return SandboxHost.objects.get(name=host_id[:64])
