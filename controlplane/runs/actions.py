"""Every state change of a run. Views and tasks parse and authenticate, then call these.

Rules kept here (DESIGN.md, Runs):
- Each lifecycle UPDATE is a compare-and-set on the status it expects, so a redelivered
  task or a replayed request can never move a run twice.
- Every terminal path goes through ``_finish``: it claims the row, revokes the run's keys,
  wipes its injected secrets, records a ``result`` event and seals the receipt, all in
  one transaction, and records the run's progress notification (sent after commit).
  Follow-ups happen only when the claim landed.
- Appends lock the run row first, so nothing is added after the receipt is sealed and
  sequence numbers have no gaps.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from controlplane import pgnotify
from controlplane.owners import admission
from holdfast_wire.logfmt import fields

from . import credentials, dispatch, notifications, receipts
from .errors import (
    BatchKeyConflict,
    EventsTruncated,
    InstanceConflict,
    RunNotFound,
    RunTerminal,
    Unauthorized,
)
from .jobs import validate_job, validate_owner, validate_secrets
from .models import (
    LIVE_STATUSES,
    Receipt,
    Run,
    RunEvent,
    RunEventBatch,
    RunStatus,
)
from .redaction import diagnostic, run_redactor

logger = logging.getLogger(__name__)


# --- creation and launch ----------------------------------------------------------------


def create_run(owner: str, job: dict, secrets: dict[str, str] | None = None, *, callback_url: str = "") -> Run:
    """A queued run. It has no key yet: the launch key is minted when a task claims it
    (``claim_for_launch``), so nothing secret exists before a host is about to need it.
    Raises BadRequest for a malformed job, and an OwnerError subclass
    (controlplane/owners/errors.py) for an unknown or disabled owner or one at its cap.
    ``callback_url`` receives a signed progress notification on every terminal
    transition (notifications.py)."""
    owner = validate_owner(owner)
    job = validate_job(job)
    secrets = validate_secrets(secrets or {})
    callback_url = notifications.validate_callback_url(callback_url)
    with transaction.atomic():
        # Refuses an unknown or disabled owner and one at its live-run cap (OwnerError);
        # the owner's row stays locked until the run is committed (owners/admission.py).
        admission.admit_run(owner)
        return Run.objects.create(
            owner=owner, job=job, secrets=secrets, token_salt=credentials.new_salt(), callback_url=callback_url
        )


@dataclass(frozen=True)
class LaunchClaim:
    run_id: str
    launch_key: str
    # True when the run was already provisioning without a hello: a redelivered task asks
    # the host again, which is safe because the host launches at most once per run id.
    relaunch: bool


def claim_for_launch(run_id: object) -> LaunchClaim | None:
    """Claim a queued run (queued -> provisioning) and mint its launch key.

    The key is derived (credentials.py), so only its hash is written, in the same
    compare-and-set that claims the row. Returns None when there is nothing to launch:
    the run is running, ended, cancelled or missing.
    """
    run = Run.objects.filter(pk=run_id).only("id", "token_salt").first()
    if run is None:
        return None
    key = credentials.derive(credentials.LAUNCH, str(run.id), run.token_salt)
    claimed = Run.objects.filter(pk=run.id, status=RunStatus.QUEUED).update(
        status=RunStatus.PROVISIONING, launch_key_hash=credentials.digest(key), provisioned_at=timezone.now()
    )
    if claimed:
        return LaunchClaim(str(run.id), key, relaunch=False)
    if Run.objects.filter(pk=run.id, status=RunStatus.PROVISIONING, instance_id="").exists():
        return LaunchClaim(str(run.id), key, relaunch=True)
    return None


# --- the runner's calls -----------------------------------------------------------------


def runner_hello(run_id: object, instance_id: str) -> str:
    """Claim provisioning -> running for ``instance_id``; return its session token.

    Idempotent per instance: a replay by the instance that won gets the same token
    (derived, not stored); any other instance gets ``InstanceConflict``.
    """
    run = _get(run_id)
    token = credentials.derive(credentials.SESSION, str(run.id), run.token_salt, instance_id)
    claimed = Run.objects.filter(pk=run.id, status=RunStatus.PROVISIONING, instance_id="").update(
        status=RunStatus.RUNNING,
        instance_id=instance_id,
        session_token_hash=credentials.digest(token),
        started_at=timezone.now(),
    )
    if claimed:
        return token
    run.refresh_from_db(fields=["status", "instance_id"])
    if run.is_terminal:
        raise RunTerminal(run.status)
    if run.status == RunStatus.RUNNING:
        if run.instance_id == instance_id:
            return token
        raise InstanceConflict()
    # Queued: no launch key exists yet, so nothing could have authenticated this call.
    raise Unauthorized()


def bundle(run: Run) -> dict:
    return {"run_id": str(run.id), "job": {**run.job, "secrets": dict(run.secrets or {})}}


@dataclass(frozen=True)
class EventIn:
    type: str
    data: dict
    ts: datetime
    # The ts exactly as the runner sent it (None when it sent none, and ``ts`` is the
    # arrival time): a replay is recognised by what was sent, not by when it arrived.
    sent_ts: str | None = None


# NOTIFY'd with the run's id in the transaction that stores its events, so an event
# stream parked on it (api/sse.py) wakes when they are visible, and never for a rollback.
EVENTS_CHANNEL = "holdfast_run_events"


def _announce_events(run: Run) -> None:
    if pgnotify.enabled():
        pgnotify.send(EVENTS_CHANNEL, str(run.pk))


def append_events(run_id: object, batch_key: str, events: list[EventIn]) -> tuple[int, int]:
    """Append one batch; return (first_seq, count). A replayed batch key returns the
    original answer and adds nothing; the same key with other events is refused.

    A batch that would take the run past RUNS_MAX_EVENTS_PER_RUN, or holds an event over
    RUNS_MAX_EVENT_BYTES, is not stored: the run gets one ``events_truncated`` event
    instead (committed), and this and every later batch get ``EventsTruncated``."""
    batch_sha256 = hashlib.sha256(receipts.canonical([[e.type, e.data, e.sent_ts] for e in events])).hexdigest()
    truncated = False
    with transaction.atomic():
        # The lock serialises appends (and the terminal claim) per run. On SQLite it is a
        # no-op, and the IMMEDIATE transaction serialises every writer instead.
        run = _locked_live(run_id)
        batch = RunEventBatch.objects.filter(run=run, batch_key=batch_key).first()
        if batch is not None:
            if batch.events_sha256 != batch_sha256:
                raise BatchKeyConflict()
            return batch.first_seq, batch.count
        if run.events_truncated_at is not None:
            raise EventsTruncated()
        first_seq = _next_seq(run)
        reason = _truncation_reason(stored=first_seq - 1, events=events)
        if reason:
            _truncate_events(run, first_seq, reason)
            truncated = True
        else:
            RunEvent.objects.bulk_create(
                RunEvent(run=run, seq=first_seq + i, type=e.type, data=e.data, ts=e.ts, batch_key=batch_key)
                for i, e in enumerate(events)
            )
            RunEventBatch.objects.create(
                run=run, batch_key=batch_key, first_seq=first_seq, count=len(events), events_sha256=batch_sha256
            )
        _announce_events(run)  # the batch, or the truncation mark
    if truncated:
        # Raised after the commit, so the events_truncated event and the mark stay.
        raise EventsTruncated()
    return first_seq, len(events)


EVENTS_TRUNCATED = "events_truncated"


def _truncation_reason(*, stored: int, events: list[EventIn]) -> dict | None:
    if stored + len(events) > settings.RUNS_MAX_EVENTS_PER_RUN:
        return {"reason": "quota", "limit": settings.RUNS_MAX_EVENTS_PER_RUN, "events_stored": stored}
    largest = max(len(receipts.canonical(e.data)) for e in events)
    if largest > settings.RUNS_MAX_EVENT_BYTES:
        return {
            "reason": "event_too_large",
            "limit": settings.RUNS_MAX_EVENT_BYTES,
            "event_bytes": largest,
            "events_stored": stored,
        }
    return None


def _truncate_events(run: Run, seq: int, data: dict) -> None:
    now = timezone.now()
    RunEvent.objects.create(run=run, seq=seq, type=EVENTS_TRUNCATED, data=data, ts=now)
    Run.objects.filter(pk=run.pk).update(events_truncated_at=now)
    logger.warning(
        "run_events_truncated", extra=fields(run_id=run.pk, reason=data["reason"], events_stored=data["events_stored"])
    )


def record_result(run_id: object, status: str, *, exit_code: int | None, error: str, summary: dict) -> Receipt:
    """The runner's verdict: terminal, receipt sealed, keys revoked. A second verdict
    (a replay, or a race with cancel or reconcile) raises ``RunTerminal`` with the
    recorded status."""
    receipt = _finish(run_id, status, exit_code=exit_code, error=error, summary=summary)
    if receipt is None:
        raise RunTerminal(_get(run_id).status)
    return receipt


# --- operator and reconcile paths -----------------------------------------------------


def cancel_run(run_id: object, reason: str = "cancelled by operator") -> bool:
    """Cancel a live run. True when this call claimed it; then its sandbox is stopped on
    its host by a task, once the cancel is committed."""
    claimed = _finish(run_id, RunStatus.CANCELLED, error=reason) is not None
    if claimed:
        dispatch.enqueue_stop_on_commit(run_id)
    return claimed


def fail_run(
    run_id: object,
    error: str,
    guard: Q | None = None,
    *,
    exit_code: int | None = None,
    stop_sandbox: bool = False,
) -> bool:
    """Fail a live run, only if ``guard`` (ANDed into the claim) still holds.

    Returns whether this call claimed the row; key revocation, sealing, the progress
    notification and (``stop_sandbox``) the sandbox's stop happen only then, so a caller
    acting on a stale snapshot (reconcile) can never end a run whose state moved under
    it, nor repeat another caller's follow-ups.
    """
    claimed = _finish(run_id, RunStatus.FAILED, exit_code=exit_code, error=error, guard=guard) is not None
    if claimed and stop_sandbox:
        dispatch.enqueue_stop_on_commit(run_id)
    return claimed


# --- internals ------------------------------------------------------------------------


def _get(run_id: object) -> Run:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise RunNotFound()
    return run


def _locked_live(run_id: object) -> Run:
    run = Run.objects.select_for_update().filter(pk=run_id).first()
    if run is None:
        raise RunNotFound()
    if run.is_terminal:
        raise RunTerminal(run.status)
    return run


def _next_seq(run: Run) -> int:
    return (RunEvent.objects.filter(run=run).aggregate(m=Max("seq"))["m"] or 0) + 1


def _finish(
    run_id: object,
    status: str,
    *,
    exit_code: int | None = None,
    error: str = "",
    summary: dict | None = None,
    guard: Q | None = None,
) -> Receipt | None:
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise RunNotFound()
        if run.is_terminal:
            return None
        # The error text and summary leave the event stream (admin, show_run, logs):
        # redact them while the run's secrets and keys are still known.
        redactor = run_redactor(run)
        error = redactor.text(error)[: settings.RUNS_MAX_ERROR_CHARS]
        summary = redactor.value(summary or {})
        now = timezone.now()
        claim = Run.objects.filter(pk=run.id, status__in=LIVE_STATUSES)
        if guard is not None:
            claim = claim.filter(guard)
        claimed = claim.update(
            status=status,
            exit_code=exit_code,
            error=error,
            summary=summary,
            finished_at=now,
            key_revoked_at=now,
            secrets={},
        )
        if not claimed:
            return None
        RunEvent.objects.create(
            run=run,
            seq=_next_seq(run),
            type="result",
            data={"status": status, "exit_code": exit_code, "error": error},
            ts=now,
        )
        _announce_events(run)
        run.refresh_from_db()
        receipt = receipts.seal(run)
        # Written with the claim, sent after commit: a lost claim notifies nobody.
        notifications.record(run)
        finished = diagnostic(run, {"status": status, "exit_code": exit_code})
    logger.info("run_finished", extra=fields(**finished))
    return receipt
