"""``manage.py drain_host NAME [--timeout S]``: drain one sandbox host and wait until no
execution is in flight on it.

It marks the host draining (an operator drain). Every worker's snapshot publisher reads
that within one publish interval and retires its connections to the host now rather than
at max age (and, where the pool dials hosts directly, stops dialing it). Executions
already running there finish; new ones go elsewhere. The command watches the workers'
snapshots and the database, shows one progress line updated in place, and prints a
summary, including how many live runs the host still holds (run sandboxes keep running
through a drain and a restart; the drain does not wait on them). Exit status 0 when no
execution is left, 1 on timeout (or an unknown host).
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.management.base import CommandError
from django.db.models import Q
from django.utils import timezone

from controlplane.commands import HoldfastCommand
from controlplane.hosts import actions, snapshots
from controlplane.hosts.models import SandboxHost
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.hosts")


def live_runs_on(host_id: str) -> int:
    from controlplane.runs.models import LIVE_STATUSES, Run

    return Run.objects.filter(host_id=host_id, status__in=LIVE_STATUSES).count()


POLL_S = 0.5  # the snapshots change every publish interval (2 s); twice as often is enough
BAR_WIDTH = 20


class Command(HoldfastCommand):
    help = "Drain a sandbox host: retire the pools' connections to it and wait until nothing runs there."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="the host's name (or the host id it reports)")
        parser.add_argument(
            "--timeout", type=float, default=None, help="seconds to wait (default HOLDFAST_DRAIN_TIMEOUT_S)"
        )

    def handle(self, *args, name: str, timeout: float | None, **options) -> None:
        from controlplane.executions.models import Execution, Status

        timeout = settings.HOSTS_DRAIN_TIMEOUT_S if timeout is None else timeout
        row = SandboxHost.objects.filter(Q(name=name) | Q(host_id=name)).order_by("-name").first()
        if row is None:
            raise CommandError(f"no sandbox host named {name!r}: register it first (manage.py register_host)")
        host_id = row.reported_id
        actions.drain(row)
        row.refresh_from_db()
        drain_started_at = row.drain_started_at or timezone.now()
        started = time.monotonic()
        peak_in_flight = 0
        retired: dict[str, int] = {}  # per worker: the most connections it held during the drain
        line = ""
        while True:
            snaps = snapshots.live_snapshots()
            waiting_for = [s["worker"] for s in snaps if host_id not in s.get("draining_applied", ())]
            in_flight = connections = retiring = 0
            for snap in snaps:
                item = snap.get("hosts", {}).get(host_id)
                if item is None:
                    continue
                in_flight += item["in_flight"]
                connections += item["connections"]
                retiring += item["retiring"]
                retired[snap["worker"]] = max(retired.get(snap["worker"], 0), item["connections"])
            # Execution rows record their host when they finish; counting running rows that
            # name it too keeps this right if they ever record it at dispatch.
            running_rows = Execution.objects.filter(status=Status.RUNNING, host_id=host_id).count()
            in_flight = max(in_flight, running_rows)
            peak_in_flight = max(peak_in_flight, in_flight)
            elapsed = time.monotonic() - started
            done = not waiting_for and in_flight == 0 and connections == retiring
            new_line = self._progress(
                in_flight, peak_in_flight, connections, retiring, len(snaps) - len(waiting_for), len(snaps), elapsed
            )
            if new_line != line:
                self.stdout.write("\r" + new_line.ljust(len(line)), ending="")
                self.stdout.flush()
                line = new_line
            if done or elapsed >= timeout:
                break
            time.sleep(POLL_S)
        self.stdout.write("")
        finished = Execution.objects.filter(host_id=host_id, finished_at__gte=drain_started_at).count()
        live_runs = live_runs_on(host_id)
        outcome = "empty" if done else "timeout"
        # Run sandboxes outlive a drain on purpose (the host leaves them running on
        # SIGTERM and a restart with the same id and state dir re-adopts them), so the
        # drain does not wait on them; the operator sees how many are still there.
        summary = (
            f"{row.name}: {outcome} after {elapsed:.1f} s; connections retired {sum(retired.values())}; "
            f"executions finished during the drain {finished}; still in flight {in_flight}; "
            f"live runs still on it {live_runs}"
        )
        log.info(
            "drain_finished",
            extra=fields(
                host=row.name,
                host_id=host_id,
                source="operator",
                outcome=outcome,
                elapsed_s=round(elapsed, 1),
                connections_retired=sum(retired.values()),
                finished=finished,
                in_flight=in_flight,
            ),
        )
        if not snaps:
            self.stdout.write("note: no worker process is publishing snapshots, so no pool holds work on it")
        self.stdout.write(summary)
        if not done:
            pending = f"; workers that have not applied the drain: {', '.join(waiting_for)}" if waiting_for else ""
            raise CommandError(f"drain of {row.name} timed out after {timeout:g} s{pending}")

    @staticmethod
    def _progress(
        in_flight: int, peak: int, connections: int, retiring: int, applied: int, workers: int, elapsed: float
    ) -> str:
        share = 1.0 if peak == 0 else 1.0 - in_flight / peak
        filled = round(share * BAR_WIDTH)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        return (
            f"[{bar}] in flight {in_flight}/{peak}  connections {connections} ({retiring} retiring)  "
            f"workers applied {applied}/{workers}  {elapsed:.0f}s"
        )
