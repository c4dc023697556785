"""What the drain page shows, built from the cache (worker snapshots) and the database.

Nothing here opens a connection to a host: a page that dials hosts would add load to a
host that is draining and would lie for hosts behind a balancer anyway.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.hosts import probe_log, snapshots
from controlplane.hosts.models import SandboxHost, State
from controlplane.owners import usage


@dataclass
class WorkerView:
    worker: str
    connections: int
    retiring: int
    oldest_age_s: float
    in_flight: int
    finished_recent: int
    snapshot_age_s: float


@dataclass
class HostView:
    name: str
    state: str
    drained_by: str
    host_id: str
    address: str
    registered: bool
    last_seen_at: str | None
    drain_started_at: str | None
    isolation: str = ""
    reserve: int | None = None
    last_seen_ago_s: float | None = None
    drain_elapsed_s: float | None = None
    connections: int = 0
    retiring: int = 0
    oldest_age_s: float = 0.0
    in_flight: int = 0
    finished_recent: int = 0
    empty_by: str | None = None
    empty_in_s: float | None = None
    workers: list[WorkerView] = field(default_factory=list)
    # Runs whose sandbox this host holds (queued ones have no host yet).
    live_runs: int = 0
    # What reconcile's last probes heard (probe_log): a silent host's runs are not judged.
    probe_last_answer_at: str | None = None
    probe_silent_since: str | None = None
    probe_silent_s: float | None = None


def _unregistered(host_id: str) -> HostView:
    """A host some worker or probe knows of and no row names yet."""
    return HostView(
        name=host_id,
        state=State.ACTIVE,
        drained_by="",
        host_id=host_id,
        address="",
        registered=False,
        last_seen_at=None,
        drain_started_at=None,
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _ago(now: datetime, then: datetime | None) -> float | None:
    return round(max(0.0, (now - then).total_seconds()), 1) if then else None


def build(*, now: datetime | None = None) -> dict:
    """The page's figures as a JSON-safe dict."""
    from controlplane.executions.models import Execution, Status

    now = now or timezone.now()
    wall = time.time()
    snaps = snapshots.live_snapshots()
    rows = list(SandboxHost.objects.all())
    views: dict[str, HostView] = {}
    for row in rows:
        views[row.reported_id] = HostView(
            name=row.name,
            state=row.state,
            drained_by=row.drained_by,
            host_id=row.host_id,
            address=row.address,
            registered=True,
            last_seen_at=_iso(row.last_seen_at),
            drain_started_at=_iso(row.drain_started_at),
            isolation=row.isolation,
            last_seen_ago_s=_ago(now, row.last_seen_at),
            drain_elapsed_s=_ago(now, row.drain_started_at),
        )
    youngest_open: dict[str, float] = {}
    max_age_s = max((s.get("max_age_s", 0.0) for s in snaps), default=settings.SANDBOX_CONNECTION_MAX_AGE_S)
    busy_workers: dict[str, set[str]] = {}
    for snap in snaps:
        for host_id, item in snap.get("hosts", {}).items():
            if not (item["connections"] or item["finished_recent"]):
                continue
            view = views.get(host_id)
            if view is None:  # seen by a worker, registered on its next publish
                view = views[host_id] = _unregistered(host_id)
            view.workers.append(
                WorkerView(
                    worker=snap["worker"],
                    connections=item["connections"],
                    retiring=item["retiring"],
                    oldest_age_s=item["oldest_age_s"],
                    in_flight=item["in_flight"],
                    finished_recent=item["finished_recent"],
                    snapshot_age_s=round(max(0.0, wall - snap.get("published_at", wall)), 1),
                )
            )
            view.isolation = item.get("isolation") or view.isolation
            if item.get("reserve") is not None:
                view.reserve = item["reserve"]
            view.connections += item["connections"]
            view.retiring += item["retiring"]
            view.oldest_age_s = max(view.oldest_age_s, item["oldest_age_s"])
            view.in_flight += item["in_flight"]
            view.finished_recent += item["finished_recent"]
            if item["youngest_open_age_s"] is not None:
                youngest_open[host_id] = min(youngest_open.get(host_id, 1e18), item["youngest_open_age_s"])
            if item["in_flight"]:
                busy_workers.setdefault(host_id, set()).add(snap["worker"])
    # Executions running on the workers that hold work on each host: the longest one
    # bounds how long the host stays busy once its connections stop taking work.
    all_busy = set().union(*busy_workers.values()) if busy_workers else set()
    deadlines: dict[str, datetime] = {}
    if all_busy:
        for worker, started_at, timeout_ms in Execution.objects.filter(
            status=Status.RUNNING, worker__in=all_busy, started_at__isnull=False
        ).values_list("worker", "started_at", "timeout_ms"):
            deadline = started_at + timedelta(milliseconds=timeout_ms)
            deadlines[worker] = max(deadlines.get(worker, deadline), deadline)
    for host_id, view in views.items():
        if view.state != State.DRAINING:
            continue
        if view.connections == 0 and view.in_flight == 0:
            view.empty_by, view.empty_in_s = _iso(now), 0.0
            continue
        # Connections still open retire at max age at the latest (the youngest last);
        # what they run then ends by its timeout.
        retire_in = max(0.0, max_age_s - youngest_open[host_id]) if host_id in youngest_open else 0.0
        longest = max(
            ((deadlines[w] - now).total_seconds() for w in busy_workers.get(host_id, ()) if w in deadlines),
            default=0.0,
        )
        empty_in = retire_in + max(0.0, longest)
        view.empty_in_s = round(empty_in, 1)
        view.empty_by = _iso(now + timedelta(seconds=empty_in))
    _add_runs_and_probes(views, now)
    order = {State.DRAINING: 0, State.ACTIVE: 1, State.GONE: 2}
    hosts = sorted(views.values(), key=lambda v: (order.get(v.state, 3), v.name))
    return {
        "generated_at": _iso(now),
        "refresh_s": settings.HOSTS_PAGE_REFRESH_S,
        "finished_window_s": settings.HOSTS_FINISHED_WINDOW_S,
        "max_age_s": max_age_s,
        "workers": sorted(s["worker"] for s in snaps),
        "hosts": [asdict(v) for v in hosts],
        # Per owner: running, queued, and the last minute's rate (owners/usage.py).
        "owners": usage.by_owner(now=now),
    }


def _add_runs_and_probes(views: dict[str, HostView], now: datetime) -> None:
    """Live runs per host (database) and reconcile's probe silence per host (cache). A
    host that holds runs but neither a registry row nor a worker connection still gets
    a card: its runs are there, and its silence may be why nothing reconciles them."""
    from django.db.models import Count

    from controlplane.runs.models import PROBED_STATUSES, Run

    counts = dict(
        Run.objects.filter(status__in=PROBED_STATUSES)
        .exclude(host_id="")
        .values_list("host_id")
        .annotate(n=Count("id"))
        .values_list("host_id", "n")
    )
    probes = probe_log.entries()
    for host_id in set(counts) | set(probes):
        view = views.get(host_id)
        if view is None:
            if not counts.get(host_id):
                continue  # probed once, no runs left, not registered: nothing to show
            view = views[host_id] = _unregistered(host_id)
        view.live_runs = counts.get(host_id, 0)
        entry = probes.get(host_id) or {}
        if entry.get("last_answer_at"):
            view.probe_last_answer_at = _iso(datetime.fromtimestamp(entry["last_answer_at"], tz=UTC))
        if entry.get("silent_since"):
            silent_since = datetime.fromtimestamp(entry["silent_since"], tz=UTC)
            view.probe_silent_since = _iso(silent_since)
            view.probe_silent_s = _ago(now, silent_since)
