"""A nudge parked while an execution of the same owner ends is never left parked beside
the slot that execution freed (dispatch.py: the claim parks, the end takes back).

Each test holds one side's transaction open on its own connection and lets the other
side run against it, so the interleaving is exact, not left to chance: a side that
must wait for the other is seen waiting on the lock in ``pg_stat_activity`` before
the first commits. Without the turn lock on the releasing side, it does not wait: it
reads "nothing parked" from before the park, and the queued row stays queued with
its owner's slot free until the sweep requeues it (a minute)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError, connection, connections, transaction

import controlplane.dispatch
from controlplane.executions import actions, dispatch, enqueue, tasks
from controlplane.executions.models import DispatchTurn, Execution
from controlplane.owners.models import Owner
from controlplane.pool.outcome import Outcome

pytestmark = pytest.mark.django_db(transaction=True)

DONE = Outcome("succeeded", exit_code=0, stdout="1\n", duration_ms=1, host_id="h1")
PATIENCE_S = 30.0


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serializes every writer: there is no interleaving to hold open")


@pytest.fixture
def capped(monkeypatch):
    """``capped`` (one at a time) running ``first`` with ``second`` queued, and the
    nudges sent from here on."""
    sent: list[tuple] = []

    def publish(name, *args):
        sent.append((name, *args))

    monkeypatch.setattr(controlplane.dispatch, "publish", publish)
    monkeypatch.setattr(enqueue, "publish", publish)  # the sweep's resend
    Owner.objects.create(name="capped", max_active=1)
    first, second = (str(actions.create(f"print({i})", owner="capped", timeout_s=5, memory_mb=64).pk) for i in range(2))
    claimed = dispatch.claim_next("test")
    assert claimed is not None and claimed.id == first
    return first, second, sent


SIDES: list[Side] = []


@pytest.fixture(autouse=True)
def let_go():
    """A failed assertion does not leave a transaction open for the teardown to wait on."""
    yield
    while SIDES:
        SIDES.pop().commit.set()


class Side(threading.Thread):
    """``work`` on a connection of its own; with ``hold``, inside a transaction kept
    open until ``commit`` is set."""

    def __init__(self, work, *, hold: bool = False) -> None:
        super().__init__(daemon=True)
        SIDES.append(self)
        self.work, self.hold = work, hold
        self.did = threading.Event()
        self.commit = threading.Event()
        self.result = self.error = None

    def run(self) -> None:
        try:
            if self.hold:
                with transaction.atomic():
                    self.result = self.work()
                    self.did.set()
                    self.commit.wait(PATIENCE_S)
            else:
                self.result = self.work()
        except BaseException as exc:  # reported by the test's thread
            self.error = exc
        finally:
            self.did.set()
            connections.close_all()

    def outcome(self):
        self.join(PATIENCE_S)
        assert not self.is_alive()
        if self.error:
            raise self.error
        return self.result


def waits_on_a_lock(side: Side) -> bool:
    """Whether ``side`` blocks on a row lock (True) or ran through (False)."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        if not side.is_alive():
            return False
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return True
        time.sleep(0.01)
    raise AssertionError("neither blocked nor done")


def test_a_claim_parking_while_an_execution_commits_its_end_waits_and_takes_the_freed_slot(capped):
    first, second, sent = capped
    ending = Side(lambda: actions.finish(first, DONE), hold=True)
    ending.start()
    assert ending.did.wait(PATIENCE_S)  # the end is written, not yet committed
    claiming = Side(lambda: dispatch.claim_next("test"))
    claiming.start()
    assert waits_on_a_lock(claiming)
    ending.commit.set()
    assert ending.outcome() is True
    claimed = claiming.outcome()
    assert claimed is not None and claimed.id == second
    assert Execution.objects.get(pk=second).status == "running"
    assert DispatchTurn.objects.get().parked == 0
    assert sent == []


def test_an_end_committing_while_a_claim_parks_waits_and_sends_the_parked_nudge(capped):
    first, second, sent = capped
    claiming = Side(lambda: dispatch.claim_next("test"), hold=True)
    claiming.start()
    assert claiming.did.wait(PATIENCE_S)
    assert claiming.result is None  # first still runs: parked, not yet committed
    ending = Side(lambda: actions.finish(first, DONE))
    ending.start()
    assert waits_on_a_lock(ending)
    claiming.commit.set()
    assert claiming.outcome() is None
    assert ending.outcome() is True
    assert DispatchTurn.objects.get().parked == 0
    assert sent == [(enqueue.RUN_EXECUTION, first)]
    assert dispatch.claim_next("test").id == second  # what the nudge sent does


def test_the_sweep_s_release_waits_for_a_claim_parking_now(capped):
    first, second, sent = capped
    claiming = Side(lambda: dispatch.claim_next("test"), hold=True)
    claiming.start()
    assert claiming.did.wait(PATIENCE_S)
    assert claiming.result is None
    Execution.objects.filter(pk=first).update(status="interrupted")  # as the sweep marks a lost worker's row
    releasing = Side(lambda: actions.resend_parked(first))
    releasing.start()
    assert waits_on_a_lock(releasing)
    claiming.commit.set()
    claiming.outcome()
    assert releasing.outcome() == 1
    assert DispatchTurn.objects.get().parked == 0
    assert sent == [(enqueue.RUN_EXECUTION, first)]
    assert dispatch.claim_next("test").id == second


@pytest.mark.parametrize("spooled", [False, True], ids=["retried at once", "spooled to the broker"])
def test_a_result_stored_whose_reply_was_lost_still_sends_the_nudge_it_took_back(capped, monkeypatch, spooled):
    """The finish statement commits (taking the parked nudge back) and the connection
    drops before its answer: the worker cannot know, retries, and finds the row ended.
    The fault is injected at that exact point: the real statement runs and commits,
    then the call fails as a cut socket does."""
    first, second, sent = capped
    assert dispatch.claim_next("test") is None  # first still runs: parked
    real = actions._finish_in_one_statement
    calls = []

    def reply_lost(*args):
        calls.append(1)
        answer = real(*args)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return answer

    monkeypatch.setattr(actions, "_finish_in_one_statement", reply_lost)
    monkeypatch.setattr(tasks.backoff, "wait", lambda *args, **kwargs: True)  # retry at once
    if spooled:
        # The worker's one attempt fails; the outcome goes to the broker, and the
        # store_outcome task stores it later.
        with pytest.raises(OperationalError):
            tasks._store(first, DONE, attempts=1)
        tasks._store(first, DONE, attempts=1, after_failure=True)
    else:
        tasks._store(first, DONE)
    assert len(calls) == 2
    assert Execution.objects.get(pk=first).status == "succeeded"
    assert DispatchTurn.objects.get().parked == 0  # taken back by the attempt that committed
    assert sent == [(enqueue.RUN_EXECUTION, first)]
    assert dispatch.claim_next("test").id == second
