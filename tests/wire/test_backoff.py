"""The one backoff schedule: a pure function, and a wait whose sleeper is injected."""

from __future__ import annotations

import pytest

from holdfast_wire import backoff


def test_the_delay_doubles_from_the_first_and_stops_at_the_cap():
    delays = [backoff.delay(n, first_s=0.05, max_s=1.0) for n in range(8)]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert backoff.delay(5000, first_s=0.05, max_s=1.0) == 1.0


def test_attempts_count_from_zero():
    with pytest.raises(ValueError):
        backoff.delay(-1, first_s=1, max_s=2)


def test_wait_sleeps_the_delay_unless_it_would_pass_the_deadline():
    slept: list[float] = []
    now = 100.0
    assert backoff.wait(2, first_s=0.5, max_s=10, deadline=102.5, clock=lambda: now, sleep=slept.append)
    assert slept == [2.0]
    assert not backoff.wait(3, first_s=0.5, max_s=10, deadline=102.5, clock=lambda: now, sleep=slept.append)
    assert slept == [2.0]  # gave up without sleeping


def test_a_gentler_factor_grows_a_poll_more_slowly():
    delays = [backoff.delay(n, first_s=0.02, max_s=0.5, factor=1.5) for n in range(10)]
    assert delays[:3] == pytest.approx([0.02, 0.03, 0.045]) and delays[-1] == 0.5
