"""``manage.py demo_deploy``: watch Holdfast survive a rolling deploy on one machine.

It starts two sandbox hosts behind a local TCP balancer (``holdfast_devtools.balancer``),
a Celery worker and a steady stream of executions, then replaces one host the way a
load balancer deregistration does:

1. the replacement joins the balancer;
2. the old host is deregistered: no new connection goes to it, open ones keep flowing;
3. the deregistration delay passes: max age + the longest execution + margin, so the
   worker's pool retires every connection to the old host and finishes what ran there;
4. the balancer cuts whatever is left (nothing, if the delay was sized right);
5. the old host gets SIGTERM and exits.

It prints one table row a second (submitted, succeeded, failed, where they ran) and the
totals. Zero failures is the expected outcome; any failure is printed with its error and
the command exits non-zero. Runs on whatever database and broker are configured (the
embedded default when nothing is set).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from controlplane.commands import HoldfastCommand

# A short max age so the whole deploy takes well under a minute; production's is 120 s.
DEFAULT_MAX_AGE_S = 5.0
# Every fourth execution sleeps this long, so some are in flight at every step.
DEFAULT_LONGEST_S = 2.0
DEFAULT_MARGIN_S = 2.0
SUBMIT_INTERVAL_S = 0.25
WARM_UP_S = 4.0
AFTER_S = 3.0
FINISH_TIMEOUT_S = 60.0
OLD, STEADY, NEW = "blue-1", "blue-2", "green-1"


class Stream:
    """Submits executions from a thread until stopped; ids in submission order."""

    def __init__(self, longest_s: float) -> None:
        self.ids: list[str] = []
        self.errors: list[str] = []
        self._longest_s = longest_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-deploy-submit", daemon=True)

    def _run(self) -> None:
        from django.db import connection

        from controlplane.executions.api import submit

        i = 0
        try:
            while not self._stop.is_set():
                seconds = self._longest_s if i % 4 == 0 else 0.1
                code = f"import time\ntime.sleep({seconds})\nprint('execution {i}')\n"
                try:
                    self.ids.append(str(submit(code, owner="demo-deploy", timeout_s=self._longest_s + 10)))
                except Exception as exc:  # a submit that fails is a failure the table must show
                    self.errors.append(f"submit {i}: {exc.__class__.__name__}: {exc}")
                i += 1
                self._stop.wait(SUBMIT_INTERVAL_S)
        finally:
            connection.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class Command(HoldfastCommand):
    help = "Replace a sandbox host behind a balancer under a stream of executions; exit 1 on any failure."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE_S, help="connection max age (s)")
        parser.add_argument("--longest", type=float, default=DEFAULT_LONGEST_S, help="longest execution (s)")
        parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN_S, help="delay margin (s)")

    def handle(self, *args, max_age: float, longest: float, margin: float, **options) -> None:
        from controlplane.hosts import actions
        from controlplane.owners.actions import ensure
        from holdfast_devtools import processes
        from holdfast_devtools.balancer import TcpBalancer

        for folder in ("queue", "processed"):
            (settings.VAR_DIR / "broker" / folder).mkdir(parents=True, exist_ok=True)
        call_command("migrate", verbosity=0, interactive=False)
        db = settings.DATABASES["default"]
        delay = max_age + longest + margin
        self.stdout.write(f"database: {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}")
        self.stdout.write(f"broker:   {settings.CELERY_BROKER_URL.split('@')[-1]}")
        self.stdout.write(
            f"deregistration delay = max age {max_age:g} s + longest execution {longest:g} s "
            f"+ margin {margin:g} s = {delay:g} s"
        )
        token = secrets.token_urlsafe(32)
        children: dict[str, processes.Child] = {}
        worker = None
        ensure("demo-deploy")  # every execution belongs to an owner
        stream = Stream(longest)
        cut = -1
        balancer = TcpBalancer().start()
        try:
            for name in (OLD, STEADY, NEW):
                children[name] = processes.start_host(token, host_id=name)
                actions.register(name, address=processes.host_url(children[name]))
            balancer.add_target(OLD, ("127.0.0.1", processes.host_port(children[OLD])))
            balancer.add_target(STEADY, ("127.0.0.1", processes.host_port(children[STEADY])))
            url = f"ws://127.0.0.1:{balancer.address[1]}"
            self.stdout.write(f"balancer: {url} -> {OLD}, {STEADY}")
            worker = processes.start_worker(
                {
                    "HOLDFAST_SANDBOX_URL": url,
                    "HOLDFAST_SANDBOX_TOKEN": token,
                    "HOLDFAST_CONNECTION_MAX_AGE_S": str(max_age),
                    "HOLDFAST_PER_CONNECTION_LIMIT": "2",
                    "HOLDFAST_MAX_CONNECTIONS": "6",
                    "HOLDFAST_HOSTS_SNAPSHOT_INTERVAL_S": "1",
                },
                concurrency=8,
                name="demo-deploy-worker",
            )
            self.stdout.write("worker:   ready\n")
            self._header()
            started = time.monotonic()
            stream.start()
            self._run_for(WARM_UP_S, stream, started, "serving")
            balancer.add_target(NEW, ("127.0.0.1", processes.host_port(children[NEW])))
            balancer.deregister(OLD)
            self._run_for(delay, stream, started, f"deregistered {OLD}")
            cut = balancer.cut(OLD)
            self._row(stream, started, f"cut {OLD} ({cut} open)")
            old_exit = children[OLD].stop()
            self._row(stream, started, f"{OLD} exited {old_exit}")
            self._run_for(AFTER_S, stream, started, "serving")
            stream.stop()
            deadline = time.monotonic() + FINISH_TIMEOUT_S
            while self._counts(stream)["running"] and time.monotonic() < deadline:
                self._run_for(1.0, stream, started, "finishing")
        finally:
            stream.stop()
            if worker is not None:
                worker.stop()
                if self._counts(stream)["running"]:
                    # Work never picked up: the worker's own words are the diagnosis.
                    self.stdout.write("worker output (last 30 lines):\n" + "\n".join(worker.lines[-30:]))
            for child in children.values():
                child.stop()
            balancer.close()
        self._totals(stream, cut)

    # --- the table -------------------------------------------------------------------

    def _counts(self, stream: Stream) -> Counter:
        from controlplane.executions.models import Execution, Status

        counts: Counter = Counter(submitted=len(stream.ids))
        rows = Execution.objects.filter(pk__in=list(stream.ids)).values_list("status", "host_id")
        for status, host_id in rows:
            if status == Status.SUCCEEDED:
                counts["succeeded"] += 1
                counts[f"host:{host_id}"] += 1
            elif status in (Status.QUEUED, Status.RUNNING):
                counts["running"] += 1
            else:
                counts["failed"] += 1
        counts["failed"] += len(stream.errors)
        return counts

    def _header(self) -> None:
        self.stdout.write(
            f"{'t':>5}  {'phase':<22} {'submitted':>9} {'succeeded':>9} {'failed':>6} {'running':>7}  "
            f"{OLD:>7} {STEADY:>7} {NEW:>7}"
        )

    def _row(self, stream: Stream, started: float, phase: str) -> None:
        c = self._counts(stream)
        self.stdout.write(
            f"{time.monotonic() - started:>4.0f}s  {phase:<22} {c['submitted']:>9} {c['succeeded']:>9} "
            f"{c['failed']:>6} {c['running']:>7}  {c['host:' + OLD]:>7} {c['host:' + STEADY]:>7} {c['host:' + NEW]:>7}"
        )

    def _run_for(self, seconds: float, stream: Stream, started: float, phase: str) -> None:
        end = time.monotonic() + seconds
        while True:
            self._row(stream, started, phase)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(1.0, left))

    def _totals(self, stream: Stream, cut: int) -> None:
        from controlplane.executions.models import Execution, Status

        c = self._counts(stream)
        self.stdout.write(
            f"\ntotals: submitted {c['submitted']}, succeeded {c['succeeded']}, failed {c['failed']}, "
            f"unfinished {c['running']}; ran on {OLD} {c['host:' + OLD]}, {STEADY} {c['host:' + STEADY]}, "
            f"{NEW} {c['host:' + NEW]}; connections to {OLD} cut by the balancer: {cut}"
        )
        bad = Execution.objects.filter(pk__in=list(stream.ids)).exclude(status=Status.SUCCEEDED)
        for row in bad:
            detail = row.error or "".join(row.stderr.strip().splitlines()[-1:])
            self.stdout.write(f"  FAILED {row.pk} status={row.status} host={row.host_id or '-'}: {detail}")
        for error in stream.errors:
            self.stdout.write(f"  FAILED {error}")
        if c["failed"] or c["running"] or not c["submitted"]:
            raise CommandError(f"{c['failed'] + c['running']} execution(s) did not succeed during the deploy")
        self.stdout.write("zero failures: the deploy kept every execution")
