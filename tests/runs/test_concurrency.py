"""Concurrent writers on real PostgreSQL transactions: sequence numbers stay gapless,
a batch key is honoured once, and an owner's receipts form one line."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from django.db import connection

from controlplane.runs import actions
from controlplane.runs.actions import EventIn
from controlplane.runs.errors import RunTerminal
from controlplane.runs.models import Receipt, RunEvent, RunEventBatch
from controlplane.runs.receipts import verify_receipt

from .conftest import launched

pytestmark = pytest.mark.django_db(transaction=True)

TS = datetime(2026, 1, 1, tzinfo=UTC)


def _running(owner: str = "acme") -> str:
    run, _ = launched(owner)
    actions.runner_hello(run.id, "i-1")
    return str(run.id)


def _together(*workers: Callable[[], object]) -> list[object]:
    """Run each worker in its own thread (own database connection), released at once."""
    gate = threading.Barrier(len(workers))
    results: list[object] = [None] * len(workers)

    def body(i: int, work: Callable[[], object]) -> None:
        gate.wait()
        try:
            results[i] = work()
        except Exception as exc:  # handed back to the test, which asserts on it
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i, w)) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def _batch(n: int, tag: str) -> list[EventIn]:
    return [EventIn("stdout", {"tag": tag, "i": i}, TS) for i in range(n)]


def test_two_appenders_with_different_batch_keys_get_gapless_sequences():
    run_id = _running()

    def appender(tag: str) -> list:
        return [actions.append_events(run_id, f"{tag}-{k}", _batch(5, tag)) for k in range(10)]

    answers = _together(lambda: appender("a"), lambda: appender("b"))
    assert not any(isinstance(a, Exception) for a in answers), answers
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 101))
    # Each batch landed contiguously, at the place its answer says.
    for first_seq, count in [pair for per_thread in answers for pair in per_thread]:
        tags = set(
            RunEvent.objects.filter(run_id=run_id, seq__gte=first_seq, seq__lt=first_seq + count).values_list(
                "data__tag", flat=True
            )
        )
        assert count == 5 and len(tags) == 1


def test_the_same_batch_racing_itself_is_appended_once():
    run_id = _running()
    answers = _together(*[lambda: actions.append_events(run_id, "same", _batch(3, "x"))] * 4)
    assert answers == [(1, 3)] * 4
    assert RunEvent.objects.filter(run_id=run_id).count() == 3
    assert RunEventBatch.objects.filter(run_id=run_id).count() == 1


def test_events_racing_the_result_are_either_sealed_or_refused():
    run_id = _running()

    def late_events() -> list:
        out = []
        for k in range(20):
            try:
                out.append(actions.append_events(run_id, f"k{k}", _batch(2, "late")))
            except RunTerminal:
                out.append("terminal")
        return out

    def finish() -> object:
        return actions.record_result(run_id, "succeeded", exit_code=0, error="", summary={})

    appended, receipt = _together(late_events, finish)
    assert isinstance(receipt, Receipt) and verify_receipt(receipt).ok
    accepted = sum(1 for a in appended if a != "terminal")
    # Every accepted batch is inside the seal; nothing was added after it.
    assert receipt.payload["events"]["count"] == accepted * 2 + 1


def test_one_owners_runs_ending_together_form_one_chain():
    run_ids = [_running("acme") for _ in range(4)]
    _together(*[lambda r=r: actions.record_result(r, "succeeded", exit_code=0, error="", summary={}) for r in run_ids])
    chain = list(Receipt.objects.filter(owner="acme").order_by("chain_index"))
    assert [r.chain_index for r in chain] == [1, 2, 3, 4]
    assert [r.previous_sha256 for r in chain] == ["", *(r.sha256 for r in chain[:-1])]
    assert all(verify_receipt(r).ok for r in chain)
