"""What the public API keeps of its own: one row per Idempotency-Key an owner used."""

from __future__ import annotations

from django.db import models


class IdempotencyRecord(models.Model):
    """A creating POST that carried ``Idempotency-Key``: what it created.

    Written in the same transaction as the execution or run it names, so either both
    exist or neither does (a refused or failed POST leaves no record, and its retry
    tries again). ``fingerprint`` is an HMAC of the route and the parsed body (the body
    may hold a run's secrets, so not a plain hash): the same key with another request is
    refused, never answered with the first one's resource."""

    owner = models.CharField(max_length=200)
    key = models.CharField(max_length=255)
    # "POST /executions" or "POST /runs": a key used on one route is not the other's.
    route = models.CharField(max_length=64)
    fingerprint = models.CharField(max_length=64)
    resource_id = models.UUIDField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="api_idempotency_owner_key")]

    def __str__(self) -> str:
        return f"{self.owner}:{self.key} -> {self.resource_id}"
