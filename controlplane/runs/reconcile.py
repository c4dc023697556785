"""Reconcile: find runs whose sandbox is gone, and runs past a deadline, and end them once.

Rules (DESIGN.md, Reconcile; issue 9):
- **One probe never fails a run.** The first ``exited``/``unknown`` observation only
  stamps ``loss_observed_at``; the run fails as ``sandbox_lost`` only when the loss
  persists past ``SANDBOX_LOSS_GRACE_S``; a probe that sees the sandbox alive clears
  the stamp. A stamp in the future is replaced by now, never taken as proof.
- **Every write compare-and-sets against the stamp this tick read**, the failure
  included: ``UPDATE ... WHERE loss_observed_at = <read value>`` (or ``IS NULL``),
  counting rows. A tick holding a stale snapshot (its probe raced another tick, a host
  restart, a slow host) can neither fail a run another tick saw alive nor erase a
  newer stamp. Two overlapping ticks are therefore harmless: exactly one claims.
- **Batched probes**: one ``probe_runs`` round trip per host per tick through the launch
  driver (``launcher.probe_hosts``). A host that does not answer leaves its runs
  untouched (not knowing is not a loss); its silence is recorded for the drain page.
- **Deadlines** (no run hangs): queued/provisioning past ``RUN_LAUNCH_DEADLINE_S`` is
  relaunched once through the idempotent launch, then failed as ``launch_lost``;
  running past its job's timeout plus ``RUN_DEADLINE_MARGIN_S`` is stopped and failed
  as ``deadline_exceeded``. A runner that stops calling is found by the probe.
- Only the claimer of a failure runs its follow-ups (``actions.fail_run``): keys
  revoked, secrets wiped, result event, receipt sealed, the sandbox stopped, the
  progress notification sent.

The driver is injectable (``tick(driver=...)``) so tests can force exact interleavings.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from controlplane.hosts import probe_log
from holdfast_wire.logfmt import fields

from . import actions, dispatch, launcher
from .models import PROBED_STATUSES, FailureReason, Run, RunStatus

log = logging.getLogger("holdfast.runs")


@dataclass
class TickReport:
    """What one tick saw and did (``manage.py reconcile --once`` prints it)."""

    started_at: datetime
    probed: dict[str, int] = field(default_factory=dict)  # host -> runs asked
    silent_hosts: list[str] = field(default_factory=list)
    alive: int = 0
    stamped: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # lost, inside the grace
    failed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # reason -> run ids
    relaunched: list[str] = field(default_factory=list)
    notifications_republished: int = 0
    # Writes that found the row moved since this tick read it (another tick, a runner).
    lost_races: int = 0
    probe_s: float = 0.0  # waiting on the hosts' answers
    duration_s: float = 0.0

    def lines(self) -> list[str]:
        out = [
            f"reconcile tick at {self.started_at.isoformat()} took {self.duration_s * 1000:.0f} ms"
            f" ({self.probe_s * 1000:.0f} ms probing)",
            "probed hosts: "
            + (", ".join(f"{h} ({n} runs)" for h, n in sorted(self.probed.items())) if self.probed else "none"),
            "silent hosts: " + (", ".join(self.silent_hosts) or "none"),
            f"alive: {self.alive}",
            f"loss stamped: {len(self.stamped)}",
            f"loss cleared: {len(self.cleared)}",
            f"lost, inside the grace: {len(self.waiting)}",
            f"relaunched: {len(self.relaunched)}",
        ]
        for reason in FailureReason:
            out.append(f"failed {reason}: {len(self.failed.get(reason, []))}")
        out.append(f"notifications republished: {self.notifications_republished}")
        out.append(f"lost races (row moved under the tick): {self.lost_races}")
        return out


def tick(*, now: datetime | None = None, driver: object | None = None) -> TickReport:
    """One reconcile pass: probe, then deadlines. Safe to run concurrently with itself."""
    started = timezone.now() if now is None else now
    report = TickReport(started_at=started)
    clock = _Clock(now)
    _probe_and_judge(report, clock, driver)
    _launch_deadlines(report, clock)
    _run_deadlines(report, clock)
    _republish_notifications(report, clock)
    report.duration_s = (timezone.now() - started).total_seconds() if now is None else 0.0
    log.info(
        "reconcile_tick",
        extra=fields(
            hosts=len(report.probed),
            silent=len(report.silent_hosts),
            stamped=len(report.stamped),
            cleared=len(report.cleared),
            failed=sum(len(v) for v in report.failed.values()),
            relaunched=len(report.relaunched),
            lost_races=report.lost_races,
        ),
    )
    return report


class _Clock:
    """A tick's time: fixed when a test gives one, otherwise read at each decision (a
    probe may take seconds, and a stamp must say when the loss was seen)."""

    def __init__(self, fixed: datetime | None) -> None:
        self.fixed = fixed

    def __call__(self) -> datetime:
        return self.fixed if self.fixed is not None else timezone.now()


# --- probe and judge ------------------------------------------------------------------


def _probe_and_judge(report: TickReport, clock: _Clock, driver: object | None) -> None:
    # The snapshot this tick decides on: each run's stamp as read here is the value every
    # later write of this tick compare-and-sets against.
    snapshot: dict[str, tuple[str, datetime | None]] = {}
    by_host: dict[str, list[str]] = defaultdict(list)
    # Three narrow columns per live run, fetched at once (10,000 rows are ~1 MB): a
    # server-side cursor would cost more round trips than it saves memory.
    rows = (
        Run.objects.filter(status__in=PROBED_STATUSES)
        .exclude(host_id="")
        .values_list("id", "host_id", "loss_observed_at")
    )
    for run_id, host_id, stamp in rows:
        key = str(run_id)
        snapshot[key] = (host_id, stamp)
        by_host[host_id].append(key)
    if not by_host:
        return
    report.probed = {host: len(ids) for host, ids in by_host.items()}
    began = time.perf_counter()
    try:
        answers = launcher.probe_hosts(dict(by_host), driver)
    except launcher.LaunchNotConfigured:
        answers = {}
    except Exception:
        # A prober that breaks must not stop the deadlines below from applying; what it
        # could not tell us is not a loss, so every host counts as silent this tick.
        log.exception("reconcile_probe_failed")
        answers = {}
    report.probe_s = time.perf_counter() - began
    report.silent_hosts = sorted(set(by_host) - set(answers))
    try:
        probe_log.record(answered=sorted(answers), silent=report.silent_hosts, at=clock())
    except Exception:
        log.exception("reconcile_probe_log_failed")  # the drain page's view only
    grace = timedelta(seconds=settings.SANDBOX_LOSS_GRACE_S)
    skew = timedelta(seconds=settings.RECONCILE_CLOCK_SKEW_S)
    for host_id, statuses in answers.items():
        for run_id in by_host[host_id]:
            probe = statuses.get(run_id)
            if probe is None:
                continue  # the host did not name it: not knowing is not a loss
            _, read_stamp = snapshot[run_id]
            now = clock()
            if probe.alive:
                report.alive += 1
                if read_stamp is not None:
                    _clear(report, run_id, read_stamp)
            elif read_stamp is None or read_stamp > now + skew:
                _stamp(report, run_id, read_stamp, now)
            elif now - read_stamp >= grace:
                _fail_lost(report, run_id, read_stamp, probe)
            else:
                report.waiting.append(run_id)


def _clear(report: TickReport, run_id: str, read_stamp: datetime) -> None:
    # Only the stamp this tick read: a newer one (another tick saw a fresh loss after
    # this tick's snapshot) must survive this tick's stale "alive".
    if Run.objects.filter(pk=run_id, loss_observed_at=read_stamp).update(loss_observed_at=None):
        report.cleared.append(run_id)
    else:
        report.lost_races += 1


def _stamp(report: TickReport, run_id: str, read_stamp: datetime | None, now: datetime) -> None:
    # First observation (or a future stamp, which can never confirm a loss): stamp now,
    # only over the value this tick read and only while the run is still probed-live.
    guard = Q(loss_observed_at__isnull=True) if read_stamp is None else Q(loss_observed_at=read_stamp)
    if Run.objects.filter(guard, pk=run_id, status__in=PROBED_STATUSES).update(loss_observed_at=now):
        report.stamped.append(run_id)
    else:
        report.lost_races += 1


def _fail_lost(report: TickReport, run_id: str, read_stamp: datetime, probe: launcher.SandboxProbe) -> None:
    seen = "exited" if probe.status == "exited" else "unknown to its host"
    code = f" (exit code {probe.exit_code})" if probe.exit_code is not None else ""
    error = f"{FailureReason.SANDBOX_LOST}: the run's sandbox is {seen}{code} and no result was recorded"
    # The failure itself compare-and-sets against the stamp this tick read: if another
    # tick cleared (sandbox alive) or replaced it meanwhile, this claim does not land.
    claimed = actions.fail_run(
        run_id,
        error,
        guard=Q(loss_observed_at=read_stamp),
        exit_code=probe.exit_code,
        stop_sandbox=True,
    )
    if claimed:
        report.failed[FailureReason.SANDBOX_LOST].append(run_id)
        log.warning("run_sandbox_lost", extra=fields(run_id=run_id, status=probe.status))
    else:
        report.lost_races += 1


# --- deadlines ------------------------------------------------------------------------


def _launch_deadlines(report: TickReport, clock: _Clock) -> None:
    """Queued or provisioning without a hello past the launch deadline: relaunch once
    (the launch is idempotent by run id, so a relaunch of a launch that did happen
    starts nothing), then fail as ``launch_lost`` once the relaunch had its deadline."""
    now = clock()
    deadline = timedelta(seconds=settings.RUN_LAUNCH_DEADLINE_S)
    cutoff = now - deadline
    ungreeted = Q(status=RunStatus.QUEUED) | Q(status=RunStatus.PROVISIONING, instance_id="")
    overdue = Q(relaunched_at__isnull=True) & (
        Q(status=RunStatus.QUEUED, created_at__lt=cutoff) | Q(status=RunStatus.PROVISIONING, provisioned_at__lt=cutoff)
    )
    for run_id, status in Run.objects.filter(ungreeted).filter(overdue).values_list("id", "status"):
        # At most once per run: the mark is set by compare-and-set from NULL, and the
        # status must still be the one read (a runner's hello meanwhile ends this).
        marked = Run.objects.filter(pk=run_id, status=status, instance_id="", relaunched_at__isnull=True).update(
            relaunched_at=now
        )
        if marked:
            dispatch.publish(dispatch.LAUNCH_RUN, str(run_id))
            report.relaunched.append(str(run_id))
            log.warning("run_relaunched", extra=fields(run_id=run_id, status=status))
        else:
            report.lost_races += 1
    for run_id, relaunched_at in (
        Run.objects.filter(ungreeted, relaunched_at__lt=cutoff).values_list("id", "relaunched_at").iterator()
    ):
        error = f"{FailureReason.LAUNCH_LOST}: no runner started within {settings.RUN_LAUNCH_DEADLINE_S:.0f} s, twice"
        claimed = actions.fail_run(run_id, error, guard=ungreeted & Q(relaunched_at=relaunched_at), stop_sandbox=True)
        if claimed:
            report.failed[FailureReason.LAUNCH_LOST].append(str(run_id))
            log.warning("run_launch_lost", extra=fields(run_id=run_id))
        else:
            report.lost_races += 1


def _run_deadlines(report: TickReport, clock: _Clock) -> None:
    """Running past the job's own timeout plus the margin: the runner's timer may have
    died with it. Stop the sandbox and fail as ``deadline_exceeded``."""
    now = clock()
    margin = timedelta(seconds=settings.RUN_DEADLINE_MARGIN_S)
    # Only runs that could be overdue at the shortest timeout are read and checked.
    earliest = now - margin - timedelta(seconds=1)
    rows = Run.objects.filter(status=RunStatus.RUNNING, started_at__lt=earliest).values_list(
        "id", "job__timeout_s", "started_at"
    )
    for run_id, job_timeout_s, started_at in rows.iterator():
        timeout_s = job_timeout_s if isinstance(job_timeout_s, int | float) else settings.RUNS_DEFAULT_TIMEOUT_S
        if started_at + timedelta(seconds=float(timeout_s)) + margin > now:
            continue
        error = f"{FailureReason.DEADLINE_EXCEEDED}: still running {timeout_s} s after start, plus the margin"
        claimed = actions.fail_run(
            run_id, error, guard=Q(status=RunStatus.RUNNING, started_at=started_at), stop_sandbox=True
        )
        if claimed:
            report.failed[FailureReason.DEADLINE_EXCEEDED].append(str(run_id))
            log.warning("run_deadline_exceeded", extra=fields(run_id=run_id))
        else:
            report.lost_races += 1


# --- notifications whose message was lost ----------------------------------------------


def _republish_notifications(report: TickReport, clock: _Clock) -> None:
    """A notification is published after its claim commits; a crash in between loses the
    message. One never attempted long after it was written is published again: the
    task's lease and its delivered mark make a duplicate message harmless."""
    from .models import RunNotification

    cutoff = clock() - timedelta(seconds=settings.NOTIFY_REPUBLISH_AFTER_S)
    stale = RunNotification.objects.filter(
        attempts=0,
        delivered_at__isnull=True,
        abandoned_at__isnull=True,
        lease_until__isnull=True,
        created_at__lt=cutoff,
    ).values_list("id", flat=True)[:1000]
    for notification_id in stale:
        dispatch.publish(dispatch.DELIVER_NOTIFICATION, notification_id)
        report.notifications_republished += 1
