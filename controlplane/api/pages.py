"""One page of a run's events after a cursor: the JSON route and both streams read it."""

from __future__ import annotations

from controlplane.runs.models import Run, RunEvent

from . import representations


def events_page(run: Run, after: int, limit: int) -> dict:
    rows = list(RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq")[:limit])
    next_after = rows[-1].seq if rows else after
    # Status read after the rows, and "more" after the status: a run that ended in
    # between (its result event appended) is never reported complete without that event.
    run.refresh_from_db(fields=["status"])
    more = RunEvent.objects.filter(run=run, seq__gt=next_after).exists()
    return {
        "events": [representations.event(e) for e in rows],
        "next_after": next_after,
        "run_status": run.status,
        # Nothing will ever follow: the run ended and every event is in this or an earlier page.
        "complete": run.is_terminal and not more,
    }
