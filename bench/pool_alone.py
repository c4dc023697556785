"""What the worker's sandbox pool adds to a host's round trip, without Celery or a
database: one trivial execution at a time through ``SandboxPool.run`` and through the
benchmarks' bare client (``bench/host_speed.py``), alternated one for one, on one real
host. The difference is the pool's own path (its connection, its reader thread handing
the result to the caller); what the worker adds beyond it is ``bench/execute_phases.py``'s
"host answered" step against this. One command:

    .venv/bin/python bench/pool_alone.py [--n 60] [--pause-s 0.1]
"""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import django_env

django_env.setup()

from bench.host_speed import SNIPPET, HostClient  # noqa: E402
from controlplane.pool.outcome import ExecRequest  # noqa: E402
from controlplane.pool.pool import PoolConfig, SandboxPool  # noqa: E402
from holdfast_devtools import processes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--pause-s", type=float, default=0.1)
    args = parser.parse_args()
    token = secrets.token_urlsafe(32)
    host = processes.start_host(token, host_id="pool-alone")
    try:
        url = processes.host_url(host)
        pool = SandboxPool(dataclasses.replace(PoolConfig.from_settings(), url=url, token=token))
        client = HostClient(url, token)

        def through_pool() -> None:
            request = ExecRequest(id=uuid.uuid4().hex, code=SNIPPET, timeout_ms=10_000, memory_mb=256)
            outcome = pool.run(request)
            if outcome.status != "succeeded":
                raise SystemExit(f"pool_alone: execution failed: {outcome}")

        timed: dict[str, list[float]] = {"SandboxPool.run": [], "the bare client's round trip": []}
        for i in range(args.n + 3):  # the first three warm the pool's connection and the host
            for label, call in zip(timed, (through_pool, client.execute), strict=True):
                time.sleep(args.pause_s)
                started = time.perf_counter()
                call()
                if i >= 3:
                    timed[label].append(time.perf_counter() - started)
        client.close()
    finally:
        host.stop()
    heading = f"1 at a time, {args.pause_s * 1000:g} ms apart, n={args.n}"
    print(f"{heading:<40} {'p50 ms':>8} {'p90 ms':>8}")
    for label, samples in timed.items():
        samples.sort()
        print(f"{label:<40} {statistics.median(samples) * 1000:>8.2f} {samples[int(len(samples) * 0.9)] * 1000:>8.2f}")


if __name__ == "__main__":
    main()
