"""What announcing run events costs: batches appended from 4 threads (4 runs) with the
NOTIFY each append sends (an event stream's wake-up, api/sse.py) and with it left out,
alternated twice, one LISTEN connection attached as a web process would hold. One
command:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench \\
    .venv/bin/python bench/events_notify.py
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run  # sets Django up

BATCHES_PER_THREAD = 300


def main() -> None:
    from django.db import connection
    from django.utils import timezone

    from controlplane.owners.models import Owner
    from controlplane.runs import actions
    from controlplane.runs.models import Run

    listening = run.postgres_listening(actions.EVENTS_CHANNEL, "events_notify")
    Owner.objects.filter(name="bench").update(max_live_runs=1000)
    runs = [actions.create_run("bench", {"kind": "shell", "command": "true"}).pk for _ in range(4)]

    def append(run_id, took: list[float]) -> None:
        for _ in range(BATCHES_PER_THREAD):
            started = time.perf_counter()
            event = actions.EventIn("stdout", {"text": "x" * 100}, timezone.now())
            actions.append_events(run_id, uuid.uuid4().hex, [event])
            took.append(time.perf_counter() - started)
        connection.close()

    announce = actions._announce_events
    try:
        print(f"{'4 threads appending one-event batches':<40} {'batches/s':>10} {'p50 ms':>8}")
        for announced in (True, False, True, False):
            actions._announce_events = announce if announced else (lambda run: None)
            took: list[float] = []
            started = time.perf_counter()
            threads = [threading.Thread(target=append, args=(pk, took)) for pk in runs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            rate = len(took) / (time.perf_counter() - started)
            what = "with NOTIFY" if announced else "without NOTIFY"
            print(f"{what:<40} {rate:>10.1f} {statistics.median(took) * 1000:>8.2f}")
    finally:
        actions._announce_events = announce
        Run.objects.filter(pk__in=runs).update(status="cancelled")
        listening.close()


if __name__ == "__main__":
    main()
