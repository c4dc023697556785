"""P2 in rounds, and where its CPU goes: rounds of ``--n`` plain Celery tasks then ``--n``
``execute()`` calls, back to back on a real host and worker (the same calls as
``bench/run.py``'s P2 rows), each round's p50 and ratio printed; then, over one more
batch of each kind, the CPU time each process used per call (the caller, the worker,
the host, the warm template and its reaped children, PostgreSQL's backends), read from
``/proc``. For comparing a change against ``main`` on a noisy
machine, where one run of the full table is not enough. One command:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/11 \\
    .venv/bin/python bench/execute_cpu.py --rounds 3 --n 40

``--reserve 58`` gives the host a reserve that covers a round of 40 (and the two
warm-up calls): its sandboxes are prepared in the pause before the round
(``sandbox_host/reserve.py``), none beside it.

With ``--loop-seconds S`` it only calls ``execute()`` back to back for S seconds: a
steady load to profile the whole machine under, with ``perf`` beside it:

    .venv/bin/python bench/execute_cpu.py --loop-seconds 20 &
    sleep 8; perf record -a -g -o /tmp/perf.data -- sleep 6
    perf report -i /tmp/perf.data --no-children --sort comm -g none --stdio
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run

HZ = os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> dict[int, tuple[str, int, int]]:
    """Every process: its command line, its own CPU ticks, its reaped children's."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        label = argv[:70] or stat[stat.index("(") + 1 : stat.rindex(")")]
        found[int(name)] = (label, int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=40, help="calls of each kind per round")
    parser.add_argument("--loop-seconds", type=float, default=0.0, help="only execute(), back to back, this long")
    parser.add_argument(
        "--reserve",
        type=int,
        default=None,
        help="the host's --reserve (default: its own); run.reserve_for_burst(n) covers a round",
    )
    args = parser.parse_args()
    run.prepare_database()
    from bench.tasks import plain_task
    from controlplane.executions.tasks import run_execution

    with run.host_and_worker(secrets.token_urlsafe(32), reserve=args.reserve) as (host, _):
        run.full_path(3, plain_task)
        run.full_path(3, run_execution)
        run.via_execute(3)
        if args.loop_seconds:
            loop(args.loop_seconds)
            return
        run.via_notified_task(3)
        for _ in range(args.rounds):
            run.wait_for_reserve(host, args.reserve)  # refilled after the last round, nothing beside
            plain = statistics.median(run.full_path(args.n, plain_task)) * 1000
            notified = statistics.median(run.via_notified_task(args.n) or [float("nan")]) * 1000
            pushed = statistics.median(run.via_execute(args.n)) * 1000
            print(
                f"plain task polled {plain:.2f} ms p50, woken by NOTIFY {notified:.2f} ms p50; "
                f"execute() {pushed:.2f} ms p50: {pushed / notified:.2f}x the notified, {pushed / plain:.2f}x "
                "the polled",
                flush=True,
            )
        batch = args.n * 5
        splits = {"execute()": cpu_split(lambda: run.via_execute(batch))}
        run.wait_for_reserve(host, args.reserve)  # its refill is execute()'s, not the plain task's
        splits["the plain task"] = cpu_split(lambda: run.full_path(batch, plain_task))
    for what, rows in splits.items():
        print(f"\nCPU per call of {what} over {batch} back to back (ms; reaped: its children that ended)")
        for used_own, used_reaped, pid, label in rows:
            print(f"{pid:>7}  own {used_own / batch:6.2f}  reaped {used_reaped / batch:6.2f}  {label}")


def loop(seconds: float) -> None:
    samples: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples += run.via_execute(20)
    print(f"execute() back to back: {len(samples)} calls, p50 {statistics.median(samples) * 1000:.1f} ms")


def cpu_split(calls) -> list[tuple[float, float, int, str]]:
    """The CPU milliseconds each process used while ``calls()`` ran (its own, and its
    reaped children's), busiest first; processes that used next to none are left out."""
    before = cpu_ticks()
    calls()
    after = cpu_ticks()
    rows = []
    for pid, (label, own, reaped) in after.items():
        if pid in before:
            used_own, used_reaped = own - before[pid][1], reaped - before[pid][2]
            if used_own + used_reaped > 2:
                rows.append((used_own * 1000 / HZ, used_reaped * 1000 / HZ, pid, label))
    return sorted(rows, key=lambda row: row[0] + row[1], reverse=True)


if __name__ == "__main__":
    main()
