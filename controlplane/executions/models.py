"""The Execution row: one snippet, its limits, and what became of it."""

from __future__ import annotations

import uuid

from django.db import models

from controlplane.executions.fields import OutputField


class Status(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED, Status.INTERRUPTED})


class Execution(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.CharField(max_length=200, db_index=True)
    code = models.TextField()
    timeout_ms = models.PositiveIntegerField()
    memory_mb = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    # OutputField: PostgreSQL text cannot hold NUL, output may (controlplane/executions/fields.py).
    stdout = OutputField(blank=True, default="")
    stderr = OutputField(blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    # Connections tried: 1, plus each move of an execution that provably never ran.
    attempts = models.PositiveIntegerField(default=0)
    host_id = models.CharField(max_length=64, blank=True, default="", db_index=True)
    worker = models.CharField(max_length=200, blank=True, default="")
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "created_at"]),
            # Fair dispatch and admission: the owners with queued work, one owner's oldest
            # queued row, and one owner's running or queued count (dispatch.py, admission.py).
            models.Index(fields=["status", "owner", "created_at"], name="execution_status_owner"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL


class DispatchTurn(models.Model):
    """The one row every worker locks to decide which queued execution runs next
    (controlplane/executions/dispatch.py). Whose turn it is, how many dispatches that
    owner has had in this turn, and how many dispatch nudges found only owners at their
    active cap (each is sent again when an execution ends)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    owner = models.CharField(max_length=200, blank=True, default="")
    used = models.PositiveIntegerField(default=0)
    parked = models.PositiveIntegerField(default=0)
    # Dispatches ever made: a liveness figure an operator can read with one query.
    dispatched = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"turn of {self.owner or '-'} ({self.used} used, {self.parked} parked)"
