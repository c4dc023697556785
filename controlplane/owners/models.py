"""Owners (the tenants work is submitted for) and their API keys.

An owner's name is what executions and runs store in their ``owner`` column, so the
history of a renamed or deleted owner stays readable. Caps left empty fall back to the
deployment's defaults (settings ``OWNER_MAX_*``)."""

from __future__ import annotations

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

# Weights above this let one owner starve the rest between two turns of theirs.
MAX_WEIGHT = 5
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class Owner(models.Model):
    name = models.CharField(
        max_length=100,
        unique=True,
        validators=[RegexValidator(NAME_PATTERN, "letters, digits, '.', '_' and '-', starting with a letter or digit")],
    )
    weight = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_WEIGHT)],
        help_text=f"dispatches per turn while others wait too (1-{MAX_WEIGHT})",
    )
    max_active = models.PositiveIntegerField(null=True, blank=True, help_text="empty: the deployment default")
    max_queued = models.PositiveIntegerField(null=True, blank=True, help_text="empty: the deployment default")
    max_live_runs = models.PositiveIntegerField(null=True, blank=True, help_text="empty: the deployment default")
    is_active = models.BooleanField(default=True, help_text="a disabled owner's new work is refused")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(weight__gte=1) & models.Q(weight__lte=MAX_WEIGHT), name="owner_weight_in_range"
            )
        ]

    def __str__(self) -> str:
        return self.name


class ApiKey(models.Model):
    """One bearer key. Only a digest is stored; the key itself is shown once."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(Owner, on_delete=models.CASCADE, related_name="api_keys")
    label = models.CharField(max_length=100, blank=True, default="")
    # The key's public first part: finds the row without scanning digests, and lets an
    # operator tell keys apart in the admin and in logs.
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.owner_id})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
