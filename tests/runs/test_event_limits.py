"""A run's events are bounded: past RUNS_MAX_EVENTS_PER_RUN events, or on one event over
RUNS_MAX_EVENT_BYTES, the run gets one ``events_truncated`` event and every later batch
is refused with ``409 events_truncated`` (a code the runner stops on)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from controlplane.runs.models import RunEvent

pytestmark = pytest.mark.django_db


def types(running) -> list[str]:
    return list(RunEvent.objects.filter(run_id=running.run_id).order_by("seq").values_list("type", flat=True))


@override_settings(RUNS_MAX_EVENTS_PER_RUN=5)
def test_past_the_quota_one_events_truncated_event_then_409(running):
    assert running.events("b1", "stdout", "stdout", "stdout").status_code == 200
    refused = running.events("b2", "stdout", "stdout", "stdout")  # 6 > 5: not stored
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "events_truncated"
    assert types(running) == ["stdout"] * 3 + ["events_truncated"]
    truncated = RunEvent.objects.get(run_id=running.run_id, type="events_truncated")
    assert truncated.data == {"reason": "quota", "limit": 5, "events_stored": 3}
    # Later batches, even ones that would fit, are refused; no second marker.
    for key in ("b3", "b4"):
        later = running.events(key, "stdout")
        assert later.status_code == 409 and later.json()["error"]["code"] == "events_truncated"
    assert types(running).count("events_truncated") == 1
    # A replay of a batch stored before the truncation still gets its original answer.
    replay = running.events("b1", "stdout", "stdout", "stdout")
    assert replay.status_code == 200 and replay.json() == {"first_seq": 1, "count": 3}


@override_settings(RUNS_MAX_EVENT_BYTES=2048)
def test_an_event_over_the_size_limit_truncates_the_run_s_events(running):
    assert running.events("b1", "stdout").status_code == 200
    big = {"type": "stdout", "data": {"line": "\x01" * 1000}, "ts": "2026-01-01T00:00:00+00:00"}
    refused = running.post("events", {"batch_key": "b2", "events": [big]})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "events_truncated"
    marker = RunEvent.objects.get(run_id=running.run_id, type="events_truncated")
    assert marker.data["reason"] == "event_too_large" and marker.data["limit"] == 2048
    assert types(running) == ["stdout", "events_truncated"]
    assert running.events("b3", "stdout").status_code == 409
