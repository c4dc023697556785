"""The fair dispatch rule itself (controlplane/executions/dispatch.py), driven in this
process against the real database: ``claim_next`` is what every worker calls for each
Celery message, so calling it here shows the order every worker follows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.executions import actions, dispatch
from controlplane.executions.models import DispatchTurn, Execution
from controlplane.owners.errors import QueueWaitExceeded
from controlplane.owners.models import Owner

pytestmark = pytest.mark.django_db


def _queue(owner: str, n: int) -> list[str]:
    return [str(actions.create(f"print({i})", owner=owner, timeout_s=5, memory_mb=64).pk) for i in range(n)]


def _order(n: int) -> list[str]:
    out = []
    for _ in range(n):
        claimed = dispatch.claim_next("test")
        out.append(Execution.objects.get(pk=claimed).owner if claimed else None)
    return out


def test_weights_give_bursts_in_name_order_while_both_have_work():
    Owner.objects.create(name="heavy", weight=3)
    Owner.objects.create(name="light", weight=1)
    _queue("light", 4)  # queued first: arrival order does not matter
    _queue("heavy", 8)
    assert _order(12) == ["heavy"] * 3 + ["light"] + ["heavy"] * 3 + ["light"] + ["heavy"] * 2 + ["light"] * 2


def test_three_owners_take_turns_and_a_newcomer_waits_at_most_one_round():
    for name, weight in (("o1", 2), ("o2", 1), ("o3", 1)):
        Owner.objects.create(name=name, weight=weight)
    _queue("o1", 10)
    _queue("o2", 10)
    assert _order(4) == ["o1", "o1", "o2", "o1"]
    _queue("o3", 2)  # arrives mid-round
    assert _order(5) == ["o1", "o2", "o3", "o1", "o1"]


def test_each_owner_s_own_work_runs_oldest_first():
    Owner.objects.create(name="solo")
    ids = _queue("solo", 3)
    assert [dispatch.claim_next("test") for _ in range(3)] == ids


def test_an_owner_at_its_active_cap_is_passed_over_and_the_nudge_is_parked():
    Owner.objects.create(name="capped", weight=5, max_active=1)
    Owner.objects.create(name="other")
    _queue("capped", 3)
    _queue("other", 1)
    assert _order(2) == ["capped", "other"]
    assert dispatch.claim_next("test") is None  # only capped has work, and it is at its cap
    assert DispatchTurn.objects.get().parked == 1
    assert dispatch.release_parked() is True
    assert dispatch.release_parked() is False


def test_a_cancelled_row_is_never_claimed():
    Owner.objects.create(name="solo")
    first, second = _queue("solo", 2)
    actions.request_cancel(first)
    assert dispatch.claim_next("test") == second
    assert dispatch.claim_next("test") is None
    assert Execution.objects.get(pk=first).status == "cancelled"


def test_a_row_queued_past_the_wait_is_not_run_and_fails_queue_wait_exceeded(settings):
    settings.EXECUTION_MAX_QUEUE_WAIT_S = 60
    Owner.objects.create(name="solo")
    stale, fresh = _queue("solo", 2)
    Execution.objects.filter(pk=stale).update(created_at=timezone.now() - timedelta(seconds=61))
    assert dispatch.claim_next("test") == fresh
    row = Execution.objects.get(pk=stale)
    assert (row.status, row.error, row.started_at) == ("failed", QueueWaitExceeded.text, None)


def test_the_sweep_expires_a_row_queued_past_the_wait_even_when_nothing_dispatches(settings):
    settings.EXECUTION_MAX_QUEUE_WAIT_S = 60
    Owner.objects.create(name="solo")
    (stale,) = _queue("solo", 1)
    Execution.objects.filter(pk=stale).update(created_at=timezone.now() - timedelta(seconds=61))
    actions.sweep()
    assert Execution.objects.get(pk=stale).error == QueueWaitExceeded.text
