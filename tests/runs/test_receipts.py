"""Issue 3, test 6: the receipt verifies, altering one event breaks it, and each
receipt chains to the previous one of the same owner."""

from __future__ import annotations

import pytest

from controlplane.runs import actions
from controlplane.runs.models import Receipt, Run, RunEvent
from controlplane.runs.receipts import verify_receipt

from .conftest import RunnerCalls, launched

pytestmark = pytest.mark.django_db


def _finished(client, owner: str, *types: str) -> Receipt:
    run, key = launched(owner)
    calls = RunnerCalls(client, str(run.id))
    calls.token = calls.post("hello", {"instance_id": "i"}, token=key).json()["session_token"]
    calls.events("b1", *types)
    sha = calls.post("result", {"status": "succeeded", "exit_code": 0}).json()["receipt_sha256"]
    return Receipt.objects.get(sha256=sha)


def test_the_receipt_verifies_and_counts_the_events(client):
    receipt = _finished(client, "acme", "stdout", "stdout", "stderr")
    assert verify_receipt(receipt).ok
    events = receipt.payload["events"]
    assert events["count"] == 4  # three from the runner, one result from the control plane
    assert events["types"] == {"result": 1, "stderr": 1, "stdout": 2}


def test_altering_one_event_breaks_verification(client):
    receipt = _finished(client, "acme", "stdout", "stdout")
    RunEvent.objects.filter(run_id=receipt.run_id, seq=2).update(data={"line": "forged"})
    assert not verify_receipt(receipt).ok


def test_adding_or_removing_an_event_breaks_verification(client):
    receipt = _finished(client, "acme", "stdout", "stdout")
    RunEvent.objects.filter(run_id=receipt.run_id, seq=1).delete()
    assert not verify_receipt(receipt).ok
    receipt = _finished(client, "acme", "stdout")
    RunEvent.objects.create(run_id=receipt.run_id, seq=99, type="stdout", data={}, ts=receipt.created_at)
    assert not verify_receipt(receipt).ok


def test_rewriting_the_verdict_or_the_digest_breaks_verification(client):
    receipt = _finished(client, "acme", "stdout")
    Run.objects.filter(pk=receipt.run_id).update(status="failed")
    assert not verify_receipt(receipt).ok
    receipt = _finished(client, "acme", "stdout")
    receipt.payload["status"] = "failed"
    assert not verify_receipt(receipt).ok


def test_each_receipt_chains_to_the_previous_receipt_of_the_same_owner(client):
    first = _finished(client, "acme", "stdout")
    elsewhere = _finished(client, "globex", "stdout")
    cancelled = launched("acme")[0]
    actions.cancel_run(cancelled.id)
    second = Receipt.objects.get(run=cancelled)
    assert (first.chain_index, first.previous_sha256) == (1, "")
    assert (second.chain_index, second.previous_sha256) == (2, first.sha256)
    assert (elsewhere.chain_index, elsewhere.previous_sha256) == (1, "")
    assert all(verify_receipt(r).ok for r in (first, second, elsewhere))


def test_a_receipt_whose_predecessor_was_replaced_no_longer_verifies(client):
    _finished(client, "acme", "stdout")
    second = _finished(client, "acme", "stdout")
    Receipt.objects.filter(owner="acme", chain_index=1).update(sha256="0" * 64)
    assert not verify_receipt(second).ok
