"""The host's execution threads (``sandbox_host/workers.py``): kept once idle, reused,
never more waiting than kept, ended after their idle time, and no job lost when one is
handed over the moment a thread gives up waiting."""

from __future__ import annotations

import random
import threading
import time

from sandbox_host.workers import Workers
from tests.timing import scaled, wait_until


def _job(seen: list, done: threading.Event, hold: threading.Event | None = None):
    def work() -> None:
        if hold is not None:
            hold.wait(scaled(10))
        seen.append((threading.get_ident(), threading.current_thread().name))
        done.set()

    return work


def test_a_thread_that_finished_runs_the_next_job_under_the_next_name():
    workers = Workers(keep=2, idle_s=scaled(10))
    seen: list = []
    for name in ("exec-a", "exec-b"):
        done = threading.Event()
        workers.run(_job(seen, done), name)
        assert done.wait(scaled(5))
        wait_until(lambda: workers.idle() == 1, timeout=5, what="the thread to wait again")
    assert [name for _, name in seen] == ["exec-a", "exec-b"]
    assert seen[0][0] == seen[1][0]  # the same thread


def test_jobs_at_once_each_get_a_thread_and_no_more_than_kept_wait_after():
    workers = Workers(keep=1, idle_s=scaled(10))
    seen: list = []
    hold = threading.Event()
    events = [threading.Event() for _ in range(3)]
    for i, done in enumerate(events):
        workers.run(_job(seen, done, hold), f"exec-{i}")
    time.sleep(0.05)
    assert seen == []  # all three are held, none waits for another's thread
    hold.set()
    assert all(done.wait(scaled(5)) for done in events)
    assert len({ident for ident, _ in seen}) == 3
    wait_until(lambda: workers.idle() == 1, timeout=5, what="one thread kept")
    time.sleep(0.05)
    assert workers.idle() == 1


def test_a_thread_idle_past_its_time_ends():
    workers = Workers(keep=2, idle_s=0.05)
    seen: list = []
    done = threading.Event()
    workers.run(_job(seen, done), "exec-once")
    assert done.wait(scaled(5))
    thread = next(t for t in threading.enumerate() if t.ident == seen[0][0])
    thread.join(scaled(5))
    assert not thread.is_alive() and workers.idle() == 0


def test_no_job_is_lost_when_handed_over_as_a_thread_stops_waiting():
    # Idle times as short as the gaps between jobs: many hand-overs race a thread's end.
    workers = Workers(keep=2, idle_s=0.001)
    rng = random.Random(7)
    count = 400
    finished = threading.Semaphore(0)
    for i in range(count):
        workers.run(finished.release, f"exec-{i}")
        time.sleep(rng.choice((0, 0.0005, 0.001, 0.002)))
    for _ in range(count):
        assert finished.acquire(timeout=scaled(10))
