"""P3 for comparing a change of the host against another checkout: trivial executions
with 8 in flight on one host (the warm template and its reserve, no pool, no database),
this checkout's host and another's alternated in rounds, and the bare spawn loop with the
same concurrency measured once per round beside them. On a noisy machine one run of
``bench/run.py`` cannot tell a change of a few percent; rounds alternated can.

    .venv/bin/python bench/host_rate.py --checkout /path/to/other/checkout [--rounds 3] [--seconds 10]

Each row is one round's rate; the last lines give the medians and each host's CPU per
execution (the host and its template, its children included, from ``/proc``).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import host_speed  # noqa: E402
from bench.cpu_split import times  # noqa: E402
from bench.run import tree  # noqa: E402 - sets Django up, as the other benches
from holdfast_devtools import processes  # noqa: E402

CONCURRENCY = 8


def cpu_s(pids: list[int]) -> float:
    """CPU seconds of ``pids`` and of their children already reaped."""
    total = 0.0
    for pid in pids:
        try:
            total += sum(times(pid))
        except OSError:
            continue  # ended since the tree was read
    return total


def one_round(checkout: Path, token: str, seconds: float) -> tuple[float, float]:
    """(executions per second, CPU seconds per execution) of ``checkout``'s host."""
    host = processes.start_host(token, host_id="rate", checkout=checkout)
    clients: list[host_speed.HostClient] = []
    try:
        ran = Path(f"/proc/{host.popen.pid}/cwd").resolve()
        if ran != checkout:
            raise SystemExit(f"host_rate: the host runs in {ran}, not {checkout}")
        url = processes.host_url(host)
        warm = host_speed.HostClient(url, token)
        time.sleep(1.0)  # the reserve fills
        host_speed.latencies(warm.execute, 5)
        warm.close()
        counted = [0]

        def make() -> Callable[[], None]:
            client = host_speed.HostClient(url, token)
            clients.append(client)

            def execute() -> None:
                client.execute()
                counted[0] += 1

            return execute

        before = cpu_s(tree(host.popen.pid))
        done_before = counted[0]
        rate = host_speed.throughput(make, CONCURRENCY, seconds)
        used = cpu_s(tree(host.popen.pid)) - before
        executions = max(1, counted[0] - done_before)
    finally:
        for client in clients:
            client.close()
        host.stop()
    return rate, used / executions


def commit_of(checkout: Path) -> str:
    found = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() or "not a git checkout"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, required=True, help="the other checkout whose host to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each host runs per round")
    args = parser.parse_args()
    token = secrets.token_urlsafe(32)
    host_speed.clean_interpreter()  # made once, before 8 threads want it
    trees = {"this": ROOT.resolve(), "other": args.checkout.resolve()}
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    bare: list[float] = []
    for name, checkout in trees.items():
        print(f"{name}: {checkout} ({commit_of(checkout)})")
    print(f"{'round':<6} {'host':<6} {'rate':>9} {'CPU ms/exec':>12} {'bare loop':>10} {'ratio':>6}")
    for number in range(1, args.rounds + 1):
        # Alternated, and the order swapped every round: neither host always runs first.
        order = list(trees) if number % 2 else list(reversed(trees))
        bare.append(host_speed.throughput(lambda: host_speed.clean_spawn, CONCURRENCY, args.seconds))
        for name in order:
            rate, cpu = one_round(trees[name], token, args.seconds)
            found[name].append((rate, cpu))
            ratio = rate / bare[-1]
            print(f"{number:<6} {name:<6} {rate:>7.1f}/s {cpu * 1000:>12.2f} {bare[-1]:>8.1f}/s {ratio:>5.2f}x")
    base = statistics.median(bare)
    for name, rounds in found.items():
        rate = statistics.median(r for r, _ in rounds)
        cpu = statistics.median(c for _, c in rounds)
        print(f"median {name:<6} {rate:>7.1f}/s {cpu * 1000:>12.2f} {base:>8.1f}/s {rate / base:>5.2f}x")


if __name__ == "__main__":
    main()
