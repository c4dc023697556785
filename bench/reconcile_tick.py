"""One reconcile tick over many live runs on real hosts: batched probes (one round trip
per host) against one probe per run, measured in the same run.

    .venv/bin/python bench/reconcile_tick.py [--runs 10000] [--hosts 4] [--ticks 5]

Uses whatever DATABASE_URL is set (migrated here; the run rows it adds are deleted at
the end). Starts ``--hosts`` real sandbox hosts and seeds each one's state directory
with run records whose pid is this process (alive, with its real start time), so the
hosts answer ``running`` through their real probe path without starting 10,000
sandboxes. The tick is ``controlplane.runs.reconcile.tick`` with the real WebSocket
driver; the baseline is the same tick with a driver that asks one run per connection
(what a per-run ``status()`` call costs), everything else equal.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import django_env  # noqa: E402

django_env.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from controlplane.runs import reconcile  # noqa: E402
from controlplane.runs.host_driver import WebSocketLaunchDriver, _TryElsewhere  # noqa: E402
from controlplane.runs.models import Run, RunStatus  # noqa: E402
from holdfast_devtools import processes  # noqa: E402
from sandbox_host.procs import start_time  # noqa: E402
from sandbox_host.runs import default_state_dir  # noqa: E402


class OneProbePerRun(WebSocketLaunchDriver):
    """The baseline: the same host client, but one connection and one ``probe_runs`` per
    run, as a reconcile that asks each run's sandbox on its own does."""

    def probe(self, run_ids_by_host):
        url_of = {}
        for url in self.urls:
            ws, auth_ok = self._connect(url)
            ws.close()
            url_of[auth_ok.host_id] = url
        answers = {}
        for host, ids in run_ids_by_host.items():
            statuses = {}
            for run_id in ids:
                try:
                    ws, _ = self._connect(url_of[host])
                except (_TryElsewhere, KeyError):
                    continue
                try:
                    statuses.update(self._probe_on(ws, [run_id]) or {})
                finally:
                    ws.close()
            answers[host] = statuses
        return answers


def seed_host(state_dir: str, run_ids: list[str]) -> None:
    runs_dir = Path(state_dir) / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    me, started = os.getpid(), start_time(os.getpid())
    for run_id in run_ids:
        record = {"run_id": run_id, "pid": me, "start_time": started, "uid": None, "run_dir": None}
        (runs_dir / f"{run_id}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--ticks", type=int, default=5, help="batched ticks measured (the baseline runs once)")
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    token = "hf-bench-" + secrets.token_hex(16)
    tag = secrets.token_hex(3)
    host_ids = [f"bench-rc-{tag}-{i}" for i in range(args.hosts)]
    owner = f"bench-reconcile-{tag}"
    hosts = []
    try:
        run_ids = [str(uuid.uuid4()) for _ in range(args.runs)]
        by_host = {h: run_ids[i :: args.hosts] for i, h in enumerate(host_ids)}
        for host_id, ids in by_host.items():
            seed_host(default_state_dir(host_id), ids)
            hosts.append(processes.start_host(token, host_id=host_id))
        now = timezone.now()
        job = {"kind": "shell", "command": "true", "inputs": {}, "timeout_s": 3600}
        Run.objects.bulk_create(
            (
                Run(
                    id=run_id,
                    owner=owner,
                    job=job,
                    status=RunStatus.RUNNING,
                    host_id=host_id,
                    instance_id="bench",
                    token_salt="bench",
                    provisioned_at=now,
                    started_at=now,
                )
                for host_id, ids in by_host.items()
                for run_id in ids
            ),
            batch_size=2000,
        )
        urls = tuple(processes.host_url(h) for h in hosts)
        common = {
            "urls": urls,
            "token": token,
            "connect_timeout_s": settings.SANDBOX_CONNECT_TIMEOUT_S,
            "reply_timeout_s": settings.RUNS_LAUNCH_REPLY_TIMEOUT_S,
            "probe_timeout_s": 60.0,
        }
        batched = WebSocketLaunchDriver(**common)
        per_run = OneProbePerRun(**common)

        reconcile.tick(driver=batched)  # warm: connections, caches, query plans
        samples, probing = [], []
        for _ in range(args.ticks):
            began = time.perf_counter()
            report = reconcile.tick(driver=batched)
            samples.append(time.perf_counter() - began)
            probing.append(report.probe_s)
            assert report.alive == args.runs and not report.silent_hosts, report.lines()
        # One host's share: on separate machines (production) hosts answer side by side,
        # so a tick costs about this plus the database work; here 4 hosts share the cores.
        first = host_ids[0]
        alone = []
        for _ in range(args.ticks):
            began = time.perf_counter()
            answered = batched.probe({first: by_host[first]})
            alone.append(time.perf_counter() - began)
            assert len(answered[first]) == len(by_host[first])
        began = time.perf_counter()
        report = reconcile.tick(driver=per_run)
        baseline = time.perf_counter() - began
        assert report.alive == args.runs, report.lines()

        p50 = statistics.median(samples)
        interval = settings.RECONCILE_INTERVAL_S
        db = connection.vendor
        load = os.getloadavg()[0]
        print(
            f"Reconcile tick: runs={args.runs} hosts={args.hosts} database={db} cpus={os.cpu_count()} "
            f"python={sys.version.split()[0]} load1={load:.1f}"
        )
        print()
        print(f"{'what':44}{'tick s':>10}{'round trips':>14}")
        print(f"{'one probe per run (baseline, 1 tick)':44}{baseline:>10.2f}{args.runs:>14}")
        print(f"{'batched, p50 of ' + str(args.ticks) + ' ticks':44}{p50:>10.3f}{args.hosts:>14}")
        print(f"{'batched, worst of ' + str(args.ticks) + ' ticks':44}{max(samples):>10.3f}{args.hosts:>14}")
        print(f"{'  of which waiting on the hosts (p50)':44}{statistics.median(probing):>10.3f}")
        one = f"one host's probe alone, {len(by_host[first])} runs (p50)"
        print(f"{one:44}{statistics.median(alone):>10.3f}{1:>14}")
        print()
        print(f"speed-up (baseline / batched p50): {baseline / p50:.0f}x   (goal: at least 50x)")
        print(
            f"batched p50 as a share of the {interval:.0f} s interval: {100 * p50 / interval:.2f}%   (goal: under 1%)"
        )
    finally:
        Run.objects.filter(owner=owner).delete()
        for host in hosts:
            host.stop()
        for host_id in host_ids:
            shutil.rmtree(default_state_dir(host_id), ignore_errors=True)


if __name__ == "__main__":
    main()
