"""The two forms of the fair rule (dispatch.py: the PostgreSQL function every worker on
PostgreSQL calls, the Python steps SQLite runs) claim the same rows in the same order
and leave the same turn, over many random states: names that sort differently by code
point and by locale, weights, caps of 0 and none, deleted owners, a turn held by an
owner with nothing queued or by nobody, parked nudges, and rows past the queue wait."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from controlplane.executions import dispatch
from controlplane.executions.models import DispatchTurn, Execution
from controlplane.owners.models import Owner

pytestmark = pytest.mark.django_db

NAMES = ["a", "B", "b", "Z", "z", "0", "9", "a.b", "a-b", "a_b", "A", "ab", "aB", "x_", "y-"]
STATES = 150


def _build(rng: random.Random, now) -> None:
    names = rng.sample(NAMES, rng.randint(1, 6))
    Owner.objects.bulk_create(
        Owner(name=name, weight=rng.randint(1, 5), max_active=rng.choice([None, None, 0, 1, 2, 3]))
        for name in names
        if rng.random() < 0.8  # the rest were deleted after their work was accepted
    )
    for name in names:
        for _ in range(rng.randint(0, 5)):
            status = rng.choice(["queued", "queued", "running", "succeeded", "cancelled"])
            age = rng.choice([1, 5, 30, 700]) if status == "queued" else 5
            row = Execution.objects.create(
                id=uuid.UUID(int=rng.getrandbits(128), version=4),
                owner=name,
                code="print(1)",
                timeout_ms=1000,
                memory_mb=64,
                status=status,
            )
            created = now - timedelta(seconds=age, microseconds=rng.randint(0, 999_999))
            Execution.objects.filter(pk=row.pk).update(created_at=created)
    DispatchTurn.objects.update_or_create(
        pk=1,
        defaults={
            "owner": rng.choice([*names, "", "m"]),
            "used": rng.randint(0, 5),
            "parked": rng.randint(0, 3),
            "dispatched": 0,
        },
    )


def _outcome(claim, seed: int, claims: int, now) -> tuple:
    """What ``claims`` calls of ``claim`` do to the state ``seed`` builds, rolled back."""
    with transaction.atomic():
        _build(random.Random(seed), now)
        taken = []
        for _ in range(claims):
            claimed = claim("worker")
            taken.append(claimed.id if claimed else None)
        turn = DispatchTurn.objects.get()
        rows = sorted(Execution.objects.values_list("id", "status", "error"))
        transaction.set_rollback(True)
    return taken, (turn.owner, turn.used, turn.parked, turn.dispatched), rows


def test_the_database_form_and_the_python_form_choose_alike(settings):
    if connection.vendor != "postgresql":
        pytest.skip("the database form of the rule is PostgreSQL's")
    settings.EXECUTION_MAX_QUEUE_WAIT_S = 600  # the 700 s old rows are overdue
    now = timezone.now()
    for seed in range(STATES):
        claims = 1 + seed % 6
        in_database = _outcome(dispatch._claim_in_database, seed, claims, now)
        step_by_step = _outcome(dispatch._claim_here, seed, claims, now)
        assert in_database == step_by_step, f"state {seed}, {claims} claims"
