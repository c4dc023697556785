"""Runs, their events, receipts and per-run credentials.

Status moves only forward, and only by compare-and-set on the status it was read in::

    queued -> provisioning -> running -> succeeded | failed | cancelled | interrupted
       \\            \\-> (any terminal)          (terminal statuses are final)
        \\-> cancelled

Keys live on the row as SHA-256 hashes only (see credentials.py); ``secrets`` holds the
job's injected environment until the run ends, when it is wiped with the keys revoked.
"""

from __future__ import annotations

import uuid
from enum import StrEnum

from django.db import models


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


LIVE_STATUSES = (RunStatus.QUEUED, RunStatus.PROVISIONING, RunStatus.RUNNING)
# Runs whose sandbox a host may hold: the ones reconcile probes.
PROBED_STATUSES = (RunStatus.PROVISIONING, RunStatus.RUNNING)
TERMINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INTERRUPTED)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.CharField(max_length=200, db_index=True)
    # {"kind": "shell"|"python", "command"|"source": str, "inputs": {str: str}, "timeout_s": int}
    job = models.JSONField()
    # Injected environment values for the job. Never shown by the admin, never logged;
    # wiped when the run ends (nothing may fetch them after that anyway).
    secrets = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True)
    host_id = models.CharField(max_length=200, blank=True, default="")
    # The runner instance that said hello first; every later hello must match it.
    instance_id = models.CharField(max_length=128, blank=True, default="")
    # Mixed into every derived token of this run (credentials.py); not secret by itself.
    token_salt = models.CharField(max_length=64)
    launch_key_hash = models.CharField(max_length=64, blank=True, default="")
    session_token_hash = models.CharField(max_length=64, blank=True, default="")
    key_revoked_at = models.DateTimeField(null=True, blank=True)
    # Set once, when the run hit its event quota or sent an oversized event (the
    # events_truncated event is appended then); later batches are refused.
    events_truncated_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    # What the launch driver named the sandbox (informational; the host knows it by run id).
    sandbox_ref = models.CharField(max_length=200, blank=True, default="")
    # When reconcile first saw this run's sandbox exited or unknown on its host; cleared
    # when a probe sees it alive. The run fails only once the loss outlives the grace
    # (reconcile.py). Every write to it compare-and-sets against the value its writer
    # read. Indexed: a tick looks runs up by it.
    loss_observed_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # When the deadline path republished this run's launch (a lost Celery message): set
    # once, so a run is relaunched at most once before it fails as launch_lost.
    relaunched_at = models.DateTimeField(null=True, blank=True)
    # Where the outbound progress notification goes on every terminal transition
    # (notifications.py); set at creation, empty for none.
    callback_url = models.CharField(max_length=2000, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    provisioned_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class FailureReason(StrEnum):
    """Why the control plane (not the runner) failed a run: the ``error`` text starts with it."""

    # The host reported the sandbox exited or unknown for longer than the loss grace.
    SANDBOX_LOST = "sandbox_lost"
    # Still queued or provisioning past the launch deadline after one relaunch.
    LAUNCH_LOST = "launch_lost"
    # Still running past the job's timeout plus the margin.
    DEADLINE_EXCEEDED = "deadline_exceeded"


class RunNotification(models.Model):
    """One outbound progress notification: at most one per (run, terminal status).

    Written in the transaction that claims the terminal transition, so a lost claim
    writes none; delivered by ``tasks.deliver_notification`` (notifications.py)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="notifications")
    status = models.CharField(max_length=16, choices=RunStatus.choices)
    url = models.CharField(max_length=2000)
    attempts = models.IntegerField(default=0)
    # A sender holds the notification until this time: a redelivered task does not POST
    # it a second time while the first is in flight.
    lease_until = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Set when the attempts ran out; nothing sends it again.
    abandoned_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "status"], name="runs_notification_once")]

    def __str__(self) -> str:
        return f"notification {self.run_id}:{self.status}"


class RunEvent(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    # 1, 2, 3, ... per run without gaps: assigned under the run's row lock.
    seq = models.BigIntegerField()
    type = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)
    ts = models.DateTimeField()
    batch_key = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runs_event_seq_unique")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class RunEventBatch(models.Model):
    """One accepted events batch: a replay with the same key returns this answer."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="event_batches")
    batch_key = models.CharField(max_length=128)
    first_seq = models.BigIntegerField()
    count = models.IntegerField()
    # SHA-256 of the batch's canonical events: the same key with other events is refused.
    events_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "batch_key"], name="runs_batch_key_unique")]


class ReceiptChain(models.Model):
    """The head of one owner's receipt chain; its row lock serialises sealing."""

    owner = models.CharField(max_length=200, unique=True)
    length = models.BigIntegerField(default=0)
    head_sha256 = models.CharField(max_length=64, blank=True, default="")


class Receipt(models.Model):
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="receipt")
    owner = models.CharField(max_length=200)
    # 1, 2, 3, ... per owner: the receipt's place in its owner's chain.
    chain_index = models.BigIntegerField()
    payload = models.JSONField()
    payload_sha256 = models.CharField(max_length=64)
    previous_sha256 = models.CharField(max_length=64, blank=True, default="")
    sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["owner", "chain_index"]
        constraints = [models.UniqueConstraint(fields=["owner", "chain_index"], name="runs_receipt_chain_unique")]

    def __str__(self) -> str:
        return f"receipt {self.sha256[:12]} for {self.run_id}"


def new_steer_id() -> str:
    """``sm_`` and 32 hex digits: the only shape the steer route accepts in an ack."""
    return "sm_" + uuid.uuid4().hex


class SteerMessage(models.Model):
    """A steering message or an interrupt for a live run (runs/steering.py).

    Pending until the runner acknowledges its id (``delivered_at``) or reports it
    undeliverable (``ended``); ``attempts`` counts the polls that served it.
    """

    class Kind(models.TextChoices):
        STEER = "steer"
        INTERRUPT = "interrupt"

    class Ended(models.TextChoices):
        NONE = "", "-"
        UNDELIVERABLE = "undeliverable"

    id = models.CharField(primary_key=True, max_length=35, default=new_steer_id, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steer_messages")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    body = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    ended = models.CharField(max_length=16, choices=Ended.choices, blank=True, default="")
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["run", "delivered_at", "ended"], name="runs_steer_pending")]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} for {self.run_id}"
