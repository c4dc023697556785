"""Steering benchmark: interrupt latency, long poll against a plain 500 ms polling loop,
and the web process's cost of thousands of parked polls. PostgreSQL only (the long poll
needs NOTIFY).

    DATABASE_URL=postgres://... .venv/bin/python bench/steer.py [--n 100] [--parked 2000]

Latency is measured from ``steering.send(run, "interrupt")`` (what ``manage.py interrupt``
calls) to the job's SIGINT handler, which writes ``time.time()`` to its stdout. The
runner side is the real steer loop (runner/steer.py) and transport, acting on a real
child process; the server side is a real web process:

* baseline: ``manage.py runserver`` (WSGI), whose steer route answers at once with
  ``next_poll_s`` = 0.5: a plain 500 ms polling loop;
* long poll: uvicorn serving ``controlplane.asgi`` (the Procfile's web process).

Both serve the same run, one after the other. Then ``--parked`` other runs each park a
long poll on the uvicorn process (raw asyncio sockets, re-polling as each returns), and
the table gives the process's RSS growth and thread count, and the latency again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import django_env  # noqa: E402

django_env.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from controlplane.runs import actions, steering  # noqa: E402
from runner.steer import JobActor, SteerLoop  # noqa: E402
from runner.transport import ControlPlaneClient  # noqa: E402

JOB = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGINT, lambda *a: os.write(1, (repr(time.time()) + '\\n').encode()))\n"
    "while True:\n"
    "    time.sleep(1)\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def raise_nofile() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start(argv: list[str], port: int, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=raise_nofile,
    )
    wait_listening(port)
    return proc


def running_run() -> tuple[str, str]:
    run = actions.create_run("bench", {"kind": "shell", "command": "true"})
    actions.claim_for_launch(run.id)
    return str(run.id), actions.runner_hello(run.id, "bench-" + str(run.id))


def proc_status(pid: int) -> tuple[int, int]:
    """(VmRSS in KiB, Threads) of ``pid``."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"])


def measure(url: str, run_id: str, token: str, n: int) -> list[float]:
    child = subprocess.Popen(
        [sys.executable, "-c", JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    time.sleep(0.3)
    client = ControlPlaneClient(url, run_id, token)
    loop = SteerLoop(client, JobActor(child.pid, child.stdin.fileno()), lambda t, d: None)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    time.sleep(1.0)
    latencies = []
    for _ in range(n):
        # A random pause de-phases each send from the polling loop's rhythm.
        time.sleep(random.uniform(0.05, 0.3))
        sent = time.time()
        steering.send(run_id, "interrupt")
        handled = float(child.stdout.readline())
        latencies.append(handled - sent)
    loop.stop.set()
    child.kill()
    child.wait()
    return latencies


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def park(port: int, runs: list[tuple[str, str]], stop: threading.Event, parked: list[int]) -> None:
    """Keep one long poll per run in flight on ``port`` until ``stop``."""

    async def one(run_id: str, token: str) -> None:
        request = (
            f"GET /internal/runs/{run_id}/steer?ack= HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        ).encode()
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                await writer.drain()
                parked[0] += 1
                await reader.read()
                parked[0] -= 1
                writer.close()
            except OSError:
                await asyncio.sleep(0.5)

    async def main() -> None:
        tasks = [asyncio.create_task(one(*r)) for r in runs]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100, help="interrupts per row")
    parser.add_argument("--parked", type=int, default=2000, help="parked polls for the capacity rows")
    args = parser.parse_args()
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise SystemExit("bench/steer.py needs DATABASE_URL=postgres://... (the long poll needs NOTIFY)")
    raise_nofile()
    call_command("migrate", verbosity=0)
    from controlplane.owners.actions import ensure

    ensure("bench")
    env = {"DJANGO_SETTINGS_MODULE": os.environ["DJANGO_SETTINGS_MODULE"], "PYTHONUNBUFFERED": "1"}
    wsgi_port, asgi_port = free_port(), free_port()
    wsgi = start(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{wsgi_port}", "--noreload"],
        wsgi_port,
        {**env, "HOLDFAST_RUNS_STEER_SHORT_POLL_S": "0.5"},
    )
    asgi = start(
        [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--port", str(asgi_port), "--no-access-log"],
        asgi_port,
        env,
    )
    rows = []
    try:
        run_id, token = running_run()
        baseline = measure(f"http://127.0.0.1:{wsgi_port}", run_id, token, args.n)
        rows.append(("500 ms polling loop (baseline)", baseline, None))
        longpoll = measure(f"http://127.0.0.1:{asgi_port}", run_id, token, args.n)
        rows.append(("long poll (uvicorn, NOTIFY)", longpoll, None))

        others = [running_run() for _ in range(args.parked)]
        rss0, threads0 = proc_status(asgi.pid)
        stop, parked = threading.Event(), [0]
        parker = threading.Thread(target=park, args=(asgi_port, others, stop, parked), daemon=True)
        parker.start()
        deadline = time.monotonic() + 120
        while parked[0] < args.parked and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)
        rss1, threads1 = proc_status(asgi.pid)
        loaded = measure(f"http://127.0.0.1:{asgi_port}", run_id, token, args.n)
        rss2, threads2 = proc_status(asgi.pid)
        rows.append((f"long poll, {parked[0]} other polls parked", loaded, None))
        stop.set()
        parker.join(30)
    finally:
        for proc in (wsgi, asgi):
            proc.terminate()
            proc.wait(30)

    print(f"\nInterrupt latency, steering.send -> the job's SIGINT handler, {args.n} interrupts per row (ms)")
    print(f"{'row':<44} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for name, values, _ in rows:
        ms = [v * 1000 for v in values]
        print(f"{name:<44} {pct(ms, 50):>8.1f} {pct(ms, 90):>8.1f} {pct(ms, 99):>8.1f} {max(ms):>8.1f}")
    print(f"\nThe uvicorn web process with {args.parked} parked polls (baseline: the same process before)")
    print(f"{'':<28} {'RSS MiB':>10} {'threads':>8}")
    print(f"{'before':<28} {rss0 / 1024:>10.1f} {threads0:>8}")
    print(f"{'parked':<28} {rss1 / 1024:>10.1f} {threads1:>8}")
    print(f"{'parked, after interrupts':<28} {rss2 / 1024:>10.1f} {threads2:>8}")
    print(f"RSS growth with polls parked: {(max(rss1, rss2) - rss0) / 1024:.1f} MiB")
    print(
        f"median latency: baseline {statistics.median(baseline) * 1000:.1f} ms, long poll "
        f"{statistics.median(longpoll) * 1000:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
