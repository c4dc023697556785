"""Celery tasks for runs. They take ids and call actions (STYLE habit 5)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db.models import Q

from holdfast_wire.logfmt import fields

from . import actions, dispatch, launcher, notifications, reconcile
from .models import Run, RunStatus

log = logging.getLogger("holdfast.runs")

# The only runs a failed launch may fail: still provisioning and never greeted by a
# runner. A runner that said hello meanwhile proves the launch worked after all.
_UNGREETED = Q(status=RunStatus.PROVISIONING, instance_id="")


@shared_task(name=dispatch.LAUNCH_RUN, bind=True, acks_late=True, max_retries=None)
def launch_run(self, run_id: str) -> None:
    # Claim before asking a host: a redelivered message for a run that is already
    # running, ended or cancelled finds nothing to do. One still provisioning without a
    # hello is asked again, which the host's launch-by-run-id idempotency makes safe.
    claim = actions.claim_for_launch(run_id)
    if claim is None:
        log.info("run_launch_skipped", extra=fields(run_id=run_id))
        return
    try:
        ack = launcher.launch_on_host(claim.run_id, claim.launch_key, settings.RUNS_CONTROL_PLANE_URL)
    except (launcher.LaunchUnavailable, launcher.LaunchNotConfigured) as exc:
        attempt = self.request.retries + 1
        if attempt < settings.RUNS_LAUNCH_MAX_ATTEMPTS:
            log.warning("run_launch_retry", extra=fields(run_id=run_id, code=exc.code, attempt=attempt))
            raise self.retry(countdown=settings.RUNS_LAUNCH_RETRY_DELAY_S * 2 ** (attempt - 1)) from None
        _give_up(run_id, exc.code, attempt)
        return
    except launcher.LaunchRefused as exc:
        _give_up(run_id, exc.code, self.request.retries + 1)
        return
    # Record where it landed; only the first launch writes (a relaunch finds it set).
    Run.objects.filter(pk=run_id, host_id="", status__in=(RunStatus.PROVISIONING, RunStatus.RUNNING)).update(
        host_id=ack.host_id, sandbox_ref=ack.sandbox_ref
    )
    log.info(
        "run_launched",
        extra=fields(
            run_id=run_id, host_id=ack.host_id, relaunch=claim.relaunch, already_launched=ack.already_launched
        ),
    )


def _give_up(run_id: str, code: str, attempts: int) -> None:
    # The error text is fixed (a code), never the host's words: it lands on the row.
    claimed = actions.fail_run(run_id, f"launch failed: {code} after {attempts} attempt(s)", guard=_UNGREETED)
    log.warning("run_launch_failed", extra=fields(run_id=run_id, code=code, attempts=attempts, claimed=claimed))


@shared_task(name=dispatch.STOP_RUN_SANDBOX, bind=True, max_retries=3)
def stop_run_sandbox(self, run_id: str) -> None:
    """Kill a cancelled run's sandbox on the host that launched it. Best effort, and
    safe to repeat (``stop_run`` is idempotent): the runner also stops its job at its
    next call, which a cancelled run answers ``409 run_terminal``."""
    host_id = Run.objects.filter(pk=run_id).values_list("host_id", flat=True).first()
    if not host_id:
        return  # never launched, or launched nowhere we know of: nothing to stop
    try:
        stopped = launcher.stop_on_host(run_id, host_id)
    except launcher.LaunchNotConfigured:
        return
    if not stopped:
        log.warning("run_stop_unconfirmed", extra=fields(run_id=run_id, host_id=host_id))
        raise self.retry(countdown=settings.RUNS_LAUNCH_RETRY_DELAY_S)


@shared_task(name=dispatch.RECONCILE_RUNS, ignore_result=True)
def reconcile_runs() -> None:
    """One reconcile tick (beat, every HOLDFAST_RECONCILE_INTERVAL_S). Two that overlap
    are harmless: every write compare-and-sets against what its tick read."""
    reconcile.tick()


@shared_task(name=dispatch.DELIVER_NOTIFICATION, bind=True, acks_late=True, max_retries=None)
def deliver_notification(self, notification_id: int) -> None:
    """POST one progress notification; retried with backoff until delivered or the
    attempts (counted on its row, not by Celery) run out."""
    attempt = notifications.deliver(notification_id)
    if attempt.retry_in_s is not None:
        raise self.retry(countdown=attempt.retry_in_s)
