"""What an idle moment costs PostgreSQL's next statement: ``SELECT 1``, a one-row
UPDATE (its commit) and a transaction around a SELECT, back to back and with a pause
before each, on one autocommit connection. Every step of an execution's path waits on
statements like these after some idle time, so this is the floor under the claim and
the result's statement. One command:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    .venv/bin/python bench/pg_idle.py [--n 100] [--pauses 0,0.01,0.1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import host_speed
from bench.run import ms  # sets Django up, as the other benches


def main() -> None:
    import psycopg

    from controlplane import pgnotify

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--pauses", default="0,0.01,0.1", help="seconds before each statement, comma-separated")
    args = parser.parse_args()
    if not pgnotify.enabled():
        raise SystemExit("pg_idle: PostgreSQL only")
    with psycopg.connect(autocommit=True, **pgnotify.connect_params()) as db:
        db.execute("CREATE TABLE IF NOT EXISTS holdfast_bench_idle (id int PRIMARY KEY, v bigint NOT NULL)")
        db.execute("INSERT INTO holdfast_bench_idle VALUES (1, 0) ON CONFLICT DO NOTHING")

        def in_transaction() -> None:
            with db.transaction():
                db.execute("SELECT 1")

        statements = {
            "SELECT 1": lambda: db.execute("SELECT 1"),
            "UPDATE one row (commit)": lambda: db.execute("UPDATE holdfast_bench_idle SET v = v + 1 WHERE id = 1"),
            "BEGIN; SELECT 1; COMMIT": in_transaction,
        }
        try:
            print(f"{'statement':<26} {'pause ms':>9} {'p50 ms':>8} {'p95 ms':>8}")
            for pause in (float(p) for p in args.pauses.split(",")):
                for name, statement in statements.items():
                    time.sleep(pause)  # the first call too comes after a pause
                    p50, p95 = ms(host_speed.latencies(statement, args.n, pause_s=pause))
                    print(f"{name:<26} {pause * 1000:>9g} {p50:>8.3f} {p95:>8.3f}")
        finally:
            db.execute("DROP TABLE holdfast_bench_idle")


if __name__ == "__main__":
    main()
