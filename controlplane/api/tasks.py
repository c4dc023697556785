"""Celery tasks of the public API (STYLE habit 5: tasks call actions)."""

from __future__ import annotations

import logging

from celery import shared_task

from holdfast_wire.logfmt import fields

from . import idempotency

log = logging.getLogger("holdfast.api")


@shared_task(name="controlplane.api.tasks.purge_idempotency_records")
def purge_idempotency_records() -> int:
    deleted = idempotency.purge_expired()
    if deleted:
        log.info("idempotency_records_purged", extra=fields(count=deleted))
    return deleted
