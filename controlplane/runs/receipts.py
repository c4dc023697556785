"""Receipts: a run's events sealed with a digest chained per owner.

``payload`` is the run's verdict plus a summary of its events (count, per-type counts
and a SHA-256 over the ordered events). ``payload_sha256`` hashes its canonical JSON;
``sha256 = SHA-256(previous_sha256 ":" payload_sha256)`` links it to the owner's
previous receipt. ``verify_receipt`` recomputes all three from the stored rows, so
altering, adding or removing one event, or rewriting the run's verdict, breaks it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from .models import Receipt, ReceiptChain, Run, RunEvent

SCHEMA = "holdfast.receipt.v1"


def canonical(value: object) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the same value always gives the same bytes
    (PostgreSQL's jsonb reorders keys, so stored order cannot be relied on)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment else None


def events_summary(run_id: object) -> dict:
    digest = hashlib.sha256()
    types: Counter[str] = Counter()
    count = 0
    for seq, type_, data, ts in (
        RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "type", "data", "ts").iterator()
    ):
        digest.update(canonical([seq, type_, data, _iso(ts)]) + b"\n")
        types[type_] += 1
        count += 1
    return {"count": count, "types": dict(sorted(types.items())), "sha256": digest.hexdigest()}


def build_payload(run: Run) -> dict:
    return {
        "schema": SCHEMA,
        "run_id": str(run.id),
        "owner": run.owner,
        "status": run.status,
        "exit_code": run.exit_code,
        "error": run.error,
        "summary": run.summary,
        "created_at": _iso(run.created_at),
        "finished_at": _iso(run.finished_at),
        "events": events_summary(run.id),
    }


def chain_digest(previous_sha256: str, payload_sha256: str) -> str:
    return _sha256(f"{previous_sha256}:{payload_sha256}".encode())


def seal(run: Run) -> Receipt:
    """Seal ``run`` (already terminal, its row locked by the caller's transaction).

    The owner's chain row is locked before its head is read, so two runs of one owner
    ending together still form one line: the second waits and links to the first.
    Lock order is always run row, then chain row, so sealing cannot deadlock.
    """
    chain, _ = ReceiptChain.objects.select_for_update().get_or_create(owner=run.owner)
    payload = build_payload(run)
    payload_sha256 = _sha256(canonical(payload))
    receipt = Receipt.objects.create(
        run=run,
        owner=run.owner,
        chain_index=chain.length + 1,
        payload=payload,
        payload_sha256=payload_sha256,
        previous_sha256=chain.head_sha256,
        sha256=chain_digest(chain.head_sha256, payload_sha256),
    )
    ReceiptChain.objects.filter(pk=chain.pk).update(length=receipt.chain_index, head_sha256=receipt.sha256)
    return receipt


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok


def verify_receipt(receipt: Receipt) -> Verification:
    """Recompute ``receipt`` from the rows it seals; every mismatch is named."""
    result = Verification()
    run = Run.objects.get(pk=receipt.run_id)
    if build_payload(run) != receipt.payload:
        result.problems.append("payload does not match the run and its events")
    if _sha256(canonical(receipt.payload)) != receipt.payload_sha256:
        result.problems.append("payload_sha256 does not match the payload")
    if chain_digest(receipt.previous_sha256, receipt.payload_sha256) != receipt.sha256:
        result.problems.append("sha256 does not chain previous_sha256 and payload_sha256")
    if receipt.chain_index == 1:
        if receipt.previous_sha256:
            result.problems.append("first receipt of its owner names a previous one")
    else:
        previous = Receipt.objects.filter(owner=receipt.owner, chain_index=receipt.chain_index - 1).first()
        if previous is None or previous.sha256 != receipt.previous_sha256:
            result.problems.append("previous_sha256 is not the owner's previous receipt")
    return result
