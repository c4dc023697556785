"""What single pieces of an execution's path cost in this process, timed in a loop
back to back and with a pause before each call (the path runs after idle time): the
wire's encode and decode, against the ``asdict`` encode the wire used before; the
result's UPDATE compiled by the ORM, against its parameters made by hand as
``actions.finish`` now makes them; and ``actions.create`` (PostgreSQL: it writes rows).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    .venv/bin/python bench/path_costs.py [--n 200] [--pauses 0,0.05]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import host_speed
from bench.run import ms  # sets Django up, as the other benches


def pieces() -> dict:
    from django.db import connection
    from django.db.models import F, Q
    from django.db.models.sql import UpdateQuery
    from django.utils import timezone

    from controlplane.executions import actions
    from controlplane.executions.models import Execution, Status
    from controlplane.pool.outcome import WORKER_LOST
    from holdfast_wire import protocol

    result = protocol.Result(id=uuid.uuid4().hex, status="succeeded", exit_code=0, stdout="1\n", duration_ms=1)
    execute = protocol.encode(protocol.Execute(id=uuid.uuid4().hex, code="print(1)", timeout_ms=10_000, memory_mb=256))

    def encode_with_asdict() -> str:  # the wire's encode before the sixth session
        return json.dumps({"v": 1, "type": result.type, **asdict(result)}, separators=(",", ":"), ensure_ascii=False)

    def values() -> dict:
        return {"status": "succeeded", "exit_code": 0, "stdout": "1\n", "stderr": "", "error": "",
                "duration_ms": 1, "host_id": "bench", "finished_at": timezone.now()}  # fmt: skip

    def compiled_by_the_orm() -> None:  # finish's UPDATE before the sixth session
        rows = Execution.objects.filter(
            Q(status=Status.RUNNING) | Q(status=Status.INTERRUPTED, error=WORKER_LOST), pk=uuid.uuid4()
        )
        query = rows.query.chain(UpdateQuery)
        query.add_update_values({**values(), "attempts": F("attempts") + 1})
        query.get_compiler(rows.db).as_sql()

    def made_by_hand() -> None:  # as actions._finish_in_one_statement makes them now
        meta, given = Execution._meta, values()
        [meta.get_field(name).get_db_prep_save(given[name], connection) for name in actions.FINISH_FIELDS]
        meta.pk.get_db_prep_value(uuid.uuid4(), connection)

    found = {
        "wire: encode a result": lambda: protocol.encode(result),
        "wire: encode a result with asdict (before)": encode_with_asdict,
        "wire: decode an execute": lambda: protocol.decode(execute),
        "finish: UPDATE compiled by the ORM (before)": compiled_by_the_orm,
        "finish: parameters made by hand (now)": made_by_hand,
    }
    if connection.vendor == "postgresql":
        found["actions.create (admission, INSERT, commit)"] = lambda: actions.create(
            "print(1)", owner="bench", timeout_s=10, memory_mb=256
        )
    return found


def main() -> None:
    from django.core.management import call_command

    from controlplane.executions.models import Execution, Status
    from controlplane.owners.actions import ensure

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--pauses", default="0,0.05", help="seconds before each call, comma-separated")
    args = parser.parse_args()
    call_command("migrate", verbosity=0, interactive=False)
    ensure("bench")
    before = set(Execution.objects.filter(owner="bench", status=Status.QUEUED).values_list("pk", flat=True))
    print(f"{'piece':<46} {'pause ms':>9} {'p50 µs':>9} {'p95 µs':>9}")
    try:
        for pause in (float(p) for p in args.pauses.split(",")):
            for name, piece in pieces().items():
                piece()  # warm: imports, caches
                time.sleep(pause)  # the first call too comes after a pause
                p50, p95 = ms(host_speed.latencies(piece, args.n, pause_s=pause))
                print(f"{name:<46} {pause * 1000:>9g} {p50 * 1000:>9.1f} {p95 * 1000:>9.1f}")
    finally:
        # The rows create() queued here: never run, and never left for a worker to find.
        Execution.objects.filter(owner="bench", status=Status.QUEUED).exclude(pk__in=before).delete()


if __name__ == "__main__":
    main()
