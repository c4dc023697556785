"""Which queued execution runs next: weighted round-robin across owners, decided in the
database so every worker of every machine follows one order.

The rule (docs/operations.md, "Fair dispatch"):

* Owners with queued work take turns in the order of their names. On its turn an owner
  dispatches up to ``weight`` executions (1-5), its oldest first; then the turn passes
  to the next owner, by name and wrapping around, that has queued work.
* An owner already running ``max_active`` executions is skipped, not waited for: the
  turn passes over it as if it had nothing queued.
* So while two owners both have work queued, one of weight ``w`` gets ``w`` dispatches
  for every 1 of a weight-1 owner, and no owner waits more than the sum of the other
  owners' weights before its next dispatch. Example, one slot, ``a`` (weight 2) with
  a-1..a-3 queued and ``b`` (weight 1) with b-1, b-2: a-1, a-2, b-1, a-3, b-2.

How: each Celery message (``run_execution``) is a nudge to dispatch one slot, not a
ticket for one row. The worker that takes it locks the single ``DispatchTurn`` row
(``SELECT ... FOR UPDATE`` on PostgreSQL; on SQLite every transaction is ``BEGIN
IMMEDIATE``, which serializes writers the same way), reads whose turn it is and the
owners' queued and running counts under that lock, and claims the chosen row with the
same compare-and-set as ever (queued -> running). A nudge redelivered or sent twice
dispatches at most one more execution that was queued anyway; nothing that left the
queue can be claimed again (DESIGN.md: never re-run what may have run).

A nudge that finds only owners at their active cap claims nothing and is counted as
``parked`` (at most one per queued row it could not take); each execution that ends
takes one parked nudge back and sends it again (``release_parked``), so work skipped
for a cap is dispatched when its owner drops below it, not at the next sweep.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from controlplane.executions.models import DispatchTurn, Execution, Status
from controlplane.owners.errors import QueueWaitExceeded
from controlplane.owners.models import Owner
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.executions")

# Rows expired per call, oldest first: bounds the work done while the turn is locked.
EXPIRE_BATCH = 500


def _turn() -> DispatchTurn:
    """The locked turn row, created on first use (a fresh database, a flushed test)."""
    turn = DispatchTurn.objects.select_for_update().filter(pk=1).first()
    if turn is None:
        try:
            with transaction.atomic():
                DispatchTurn.objects.create(pk=1)
        except IntegrityError:
            pass  # another worker created it first
        turn = DispatchTurn.objects.select_for_update().get(pk=1)
    return turn


def expire_overdue(now=None) -> list[str]:
    """queued -> failed for rows older than EXECUTION_MAX_QUEUE_WAIT_S: never run, with
    the queue_wait_exceeded text. A compare-and-set: loses to a claim or a cancel."""
    from controlplane.executions import notify

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.EXECUTION_MAX_QUEUE_WAIT_S)
    ids = list(
        Execution.objects.filter(status=Status.QUEUED, created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("pk", flat=True)[:EXPIRE_BATCH]
    )
    if not ids:
        return []
    expired = [
        str(pk)
        for pk in ids
        if Execution.objects.filter(pk=pk, status=Status.QUEUED).update(
            status=Status.FAILED, error=QueueWaitExceeded.text, finished_at=now
        )
    ]
    for pk in expired:
        notify.publish(pk)
    if expired:
        log.info("executions_queue_wait_exceeded", extra=fields(count=len(expired)))
    return expired


def _next_owner(turn: DispatchTurn, eligible: list[str], weights: dict[str, int]) -> tuple[str, int]:
    """The owner to dispatch for and its count in this turn, by the rule above.
    ``eligible`` is sorted by name."""
    if turn.owner in eligible and turn.used < weights.get(turn.owner, 1):
        return turn.owner, turn.used + 1
    later = [name for name in eligible if name > turn.owner]
    return (later or eligible)[0], 1


class Claimed(NamedTuple):
    """A claimed execution and what its worker sends to a host, read with the claim."""

    id: str
    code: str
    timeout_ms: int
    memory_mb: int


def claim_next(worker: str) -> Claimed | None:
    """Claim the next execution by the fair rule (queued -> running) and return it, or
    None when nothing can be dispatched now. Exactly one worker can claim a row.

    Every step runs under the one turn lock, so its cost is paid by every worker's claim
    (docs/operations.md). On PostgreSQL the rule runs in the database
    (``holdfast_claim_next``, migration 0004): one round trip where the steps below
    take eight, and the turn lock is held for the function's run only, not across the
    network. SQLite runs the same rule here; the tests hold both to one order."""
    if connection.vendor == "postgresql":
        return _claim_in_database(worker)
    return _claim_here(worker)


def _claim_in_database(worker: str) -> Claimed | None:
    while True:
        now = timezone.now()
        cutoff = now - timedelta(seconds=settings.EXECUTION_MAX_QUEUE_WAIT_S)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT outcome, execution_id, code, timeout_ms, memory_mb FROM holdfast_claim_next(%s, %s, %s, %s)",
                [worker, settings.OWNER_MAX_ACTIVE, cutoff, now],
            )
            outcome, pk, code, timeout_ms, memory_mb = cursor.fetchone()
        if outcome == "claimed":
            return Claimed(str(pk), code, timeout_ms, memory_mb)
        if outcome == "overdue":
            expire_overdue()  # the chosen row waited too long: never run; choose again
            continue
        if outcome == "parked":
            log.info("dispatch_parked", extra=fields())
        return None


def _claim_here(worker: str) -> Claimed | None:
    """The rule step by step in Python, each step a query (SQLite). Rows queued past the
    wait are expired when one comes up as the choice (the oldest row of an owner is
    always the one chosen, so none can run), and by the sweep otherwise, instead of a
    search at every claim."""
    with transaction.atomic():
        turn = _turn()
        cutoff = timezone.now() - timedelta(seconds=settings.EXECUTION_MAX_QUEUE_WAIT_S)
        while True:
            counts = (
                Execution.objects.filter(status__in=(Status.QUEUED, Status.RUNNING))
                .values("owner")
                .annotate(
                    queued=Count("pk", filter=Q(status=Status.QUEUED)),
                    running=Count("pk", filter=Q(status=Status.RUNNING)),
                )
                .values_list("owner", "queued", "running")
            )
            queued, running = {}, {}
            for name, waiting, active in counts:
                running[name] = active
                if waiting:
                    queued[name] = waiting
            if not queued:
                return None
            # Rows of an owner deleted since they were accepted still run (nothing
            # accepted is lost), with weight 1 and the deployment's caps.
            owners = {o.name: o for o in Owner.objects.filter(name__in=list(queued))}
            weights = {name: owners[name].weight for name in owners}
            eligible = sorted(name for name in queued if running.get(name, 0) < _max_active(owners.get(name)))
            if not eligible:
                blocked = sum(queued.values())
                DispatchTurn.objects.filter(pk=1).update(parked=min(turn.parked + 1, blocked))
                log.info("dispatch_parked", extra=fields(owners_at_cap=len(queued), queued=blocked))
                return None
            owner, used = _next_owner(turn, eligible, weights)
            row = (
                Execution.objects.filter(owner=owner, status=Status.QUEUED)
                .order_by("created_at", "pk")
                .only("pk", "created_at", "code", "timeout_ms", "memory_mb")
                .first()
            )
            if row is None:
                continue  # cancelled since the count: look again
            if row.created_at < cutoff:
                expire_overdue()  # it waited too long: never run; choose again
                continue
            # The compare-and-set every claim has always been: a row cancelled or
            # abandoned since it was read is not claimed, and the choice is made again.
            if Execution.objects.filter(pk=row.pk, status=Status.QUEUED).update(
                status=Status.RUNNING, started_at=timezone.now(), worker=worker[:200]
            ):
                DispatchTurn.objects.filter(pk=1).update(owner=owner, used=used, dispatched=F("dispatched") + 1)
                return Claimed(str(row.pk), row.code, row.timeout_ms, row.memory_mb)


def _max_active(owner: Owner | None) -> int:
    if owner is None or owner.max_active is None:
        return settings.OWNER_MAX_ACTIVE
    return owner.max_active


def release_parked() -> bool:
    """Take back one parked nudge, if any; the caller sends it again. Called when an
    execution ends, which may bring its owner back under its active cap.

    Under the turn lock, as the claim parks: a claim parking now is waited for and its
    nudge is seen (a plain ``parked > 0`` update would read the count from before it and
    leave that nudge parked beside the slot just freed)."""
    with transaction.atomic():
        turn = DispatchTurn.objects.select_for_update().filter(pk=1).only("parked").first()
        if turn is None or turn.parked <= 0:
            return False
        DispatchTurn.objects.filter(pk=1).update(parked=F("parked") - 1)
        return True
