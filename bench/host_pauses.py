"""Host side, one trivial execution at a time, at several pauses between them: the p50
from the frame's first byte written to the result's last byte read (P1's host side,
``HostClient.exchange``), on a real host with the warm template and its reserve (no
pool, no database). For comparing a change of the host against another checkout on a
noisy machine: run it on each, alternated, in the same session.

    .venv/bin/python bench/host_pauses.py [--n 200] [--pauses 0.005,0.002]
    .venv/bin/python bench/host_pauses.py --checkout /path/to/other/checkout

``--checkout`` starts that checkout's host (its ``sandbox_host`` and template) and
measures it with this checkout's client.
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import host_speed  # noqa: E402
from bench.run import ms  # noqa: E402 - sets Django up, as the other benches
from holdfast_devtools import processes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="executions per pause")
    parser.add_argument("--pauses", default="0.005,0.002", help="seconds between executions, comma-separated")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="whose host to start (default: this one)")
    args = parser.parse_args()
    pauses = [float(p) for p in args.pauses.split(",")]
    token = secrets.token_urlsafe(32)
    checkout = args.checkout.resolve()
    # The host starts in the other checkout's tree, so its modules are the ones imported
    # (``python -m`` puts the working directory first on the path).
    host = processes.start_host(token, host_id="pauses", checkout=checkout)
    try:
        ran = Path(f"/proc/{host.popen.pid}/cwd").resolve()
        if ran != checkout:
            raise SystemExit(f"host_pauses: the host runs in {ran}, not {checkout}")
        commit = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        client = host_speed.HostClient(processes.host_url(host), token)
        time.sleep(1.0)  # the reserve fills
        host_speed.latencies(client.execute, 5)
        print(f"host of {checkout} ({commit or 'not a git checkout'}), n={args.n} per pause")
        print(f"{'pause between executions':<28} {'p50 ms':>8} {'p95 ms':>8}")
        for pause in pauses:
            p50, p95 = ms(host_speed.host_side_latencies(client, args.n, pause_s=pause))
            print(f"{pause * 1000:>25g} ms {p50:>8.2f} {p95:>8.2f}")
        client.close()
    finally:
        host.stop()


if __name__ == "__main__":
    main()
