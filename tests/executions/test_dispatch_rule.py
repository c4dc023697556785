"""The fair dispatch rule itself (controlplane/executions/dispatch.py), driven in this
process against the real database: ``claim_next`` is what every worker calls for each
Celery message, so calling it here shows the order every worker follows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import controlplane.dispatch
from controlplane.executions import actions, dispatch, enqueue
from controlplane.executions.models import DispatchTurn, Execution
from controlplane.owners.errors import QueueWaitExceeded
from controlplane.owners.models import Owner
from controlplane.pool.outcome import Outcome

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True, params=["in the database", "step by step"])
def claim_rule(request, monkeypatch):
    """Each test runs against both forms of the rule: the PostgreSQL function every
    worker on PostgreSQL calls, and the Python steps SQLite runs (dispatch.py)."""
    if request.param == "step by step":
        monkeypatch.setattr(dispatch, "_claim_in_database", dispatch._claim_here)
    elif dispatch.connection.vendor != "postgresql":
        pytest.skip("the database form of the rule is PostgreSQL's")


def _claim() -> str | None:
    claimed = dispatch.claim_next("test")
    return claimed.id if claimed else None


def _queue(owner: str, n: int) -> list[str]:
    return [str(actions.create(f"print({i})", owner=owner, timeout_s=5, memory_mb=64).pk) for i in range(n)]


def _order(n: int) -> list[str]:
    out = []
    for _ in range(n):
        claimed = _claim()
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
    assert [_claim() for _ in range(3)] == ids


def test_an_owner_at_its_active_cap_is_passed_over_and_the_nudge_is_parked():
    Owner.objects.create(name="capped", weight=5, max_active=1)
    Owner.objects.create(name="other")
    _queue("capped", 3)
    _queue("other", 1)
    assert _order(2) == ["capped", "other"]
    assert _claim() is None  # only capped has work, and it is at its cap
    assert DispatchTurn.objects.get().parked == 1
    assert dispatch.release_parked() is True
    assert dispatch.release_parked() is False


def test_a_cancelled_row_is_never_claimed():
    Owner.objects.create(name="solo")
    first, second = _queue("solo", 2)
    actions.request_cancel(first)
    assert _claim() == second
    assert _claim() is None
    assert Execution.objects.get(pk=first).status == "cancelled"


def test_a_row_queued_past_the_wait_is_not_run_and_fails_queue_wait_exceeded(settings):
    settings.EXECUTION_MAX_QUEUE_WAIT_S = 60
    Owner.objects.create(name="solo")
    stale, fresh = _queue("solo", 2)
    Execution.objects.filter(pk=stale).update(created_at=timezone.now() - timedelta(seconds=61))
    assert _claim() == fresh
    row = Execution.objects.get(pk=stale)
    assert (row.status, row.error, row.started_at) == ("failed", QueueWaitExceeded.text, None)


def test_the_sweep_expires_a_row_queued_past_the_wait_even_when_nothing_dispatches(settings):
    settings.EXECUTION_MAX_QUEUE_WAIT_S = 60
    Owner.objects.create(name="solo")
    (stale,) = _queue("solo", 1)
    Execution.objects.filter(pk=stale).update(created_at=timezone.now() - timedelta(seconds=61))
    actions.sweep()
    assert Execution.objects.get(pk=stale).error == QueueWaitExceeded.text


def test_owner_names_take_turns_in_code_point_order_whatever_the_database_collation():
    # "Zed" < "abe" by code point; a linguistic collation puts "abe" first. The columns
    # take one for this test (its transaction is rolled back), as a database created
    # with an en_US locale would have.
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in ("executions_execution", "executions_dispatchturn"):
                cursor.execute(f'ALTER TABLE {table} ALTER COLUMN owner TYPE varchar(200) COLLATE "en-x-icu"')
            cursor.execute('ALTER TABLE owners_owner ALTER COLUMN name TYPE varchar(100) COLLATE "en-x-icu"')
    Owner.objects.create(name="abe")
    Owner.objects.create(name="Zed")
    _queue("abe", 2)
    _queue("Zed", 2)
    assert _order(4) == ["Zed", "abe", "Zed", "abe"]


def test_the_claim_carries_what_the_worker_sends_and_marks_the_row_running():
    Owner.objects.create(name="solo")
    row = actions.create("print('hi')", owner="solo", timeout_s=7, memory_mb=96)
    claimed = dispatch.claim_next("worker-1")
    assert claimed == dispatch.Claimed(str(row.pk), "print('hi')", 7000, 96)
    row.refresh_from_db()
    assert (row.status, row.worker) == ("running", "worker-1")
    assert row.started_at is not None
    assert DispatchTurn.objects.get().dispatched == 1


def test_work_of_a_deleted_owner_still_runs_with_weight_1():
    Owner.objects.create(name="gone", weight=5)
    Owner.objects.create(name="kept", weight=1)
    _queue("gone", 3)
    _queue("kept", 3)
    Owner.objects.filter(name="gone").delete()
    assert _order(4) == ["gone", "kept", "gone", "kept"]


def _sent_nudges(monkeypatch) -> list[tuple]:
    sent: list[tuple] = []
    monkeypatch.setattr(controlplane.dispatch, "publish", lambda name, *args: sent.append((name, *args)))
    return sent


def test_an_execution_that_ends_takes_back_one_parked_nudge_and_sends_it_once(
    monkeypatch, django_capture_on_commit_callbacks
):
    sent = _sent_nudges(monkeypatch)
    Owner.objects.create(name="capped", max_active=1)
    first, _second = _queue("capped", 2)
    assert _claim() == first
    assert _claim() is None  # capped is at its cap: the nudge is parked
    assert DispatchTurn.objects.get().parked == 1
    done = Outcome("succeeded", exit_code=0, stdout="0\n", duration_ms=3, host_id="h1")
    with django_capture_on_commit_callbacks(execute=True):
        assert actions.finish(first, done) is True
    assert DispatchTurn.objects.get().parked == 0
    assert sent == [(enqueue.RUN_EXECUTION, first)]
    row = Execution.objects.get(pk=first)
    assert (row.status, row.stdout, row.duration_ms, row.host_id, row.attempts) == ("succeeded", "0\n", 3, "h1", 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert actions.finish(first, done) is False  # recorded once; nothing taken back twice
    assert sent == [(enqueue.RUN_EXECUTION, first)]


def test_an_execution_that_ends_with_nothing_parked_sends_no_nudge(monkeypatch, django_capture_on_commit_callbacks):
    sent = _sent_nudges(monkeypatch)
    Owner.objects.create(name="solo")
    (only,) = _queue("solo", 1)
    assert _claim() == only
    with django_capture_on_commit_callbacks(execute=True):
        assert actions.finish(only, Outcome("failed", exit_code=1, stderr="bad\x00byte")) is True
    assert sent == []
    assert Execution.objects.get(pk=only).stderr == "bad\x00byte"  # the field's own conversion applied
