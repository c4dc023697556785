"""The runner's steer loop against a real HTTP server playing the steer contract, with an
injected sleeper (no test sleeps for a backoff) and, where it matters, a real job child."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from typing import Any

import pytest

from runner.steer import JobActor, SteerLoop
from runner.transport import ControlPlaneClient
from tests.runner.servers import FakeClock, Recorded, Reply, scripted_server

pytestmark = pytest.mark.peer

SESSION = "session-token-abcdefghij"


def new_id() -> str:
    return "sm_" + uuid.uuid4().hex


class SteerPlane:
    """The steer route's contract in memory: pending until acked or reported undeliverable."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.pending = list(messages)
        self.acked: list[str] = []
        self.undeliverable: list[str] = []
        self.queries: list[dict[str, list[str]]] = []
        self.lock = threading.Lock()

    def __call__(self, request: Recorded) -> Reply:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query, keep_blank_values=True)
        with self.lock:
            self.queries.append(query)
            ack = [i for v in query.get("ack", []) for i in v.split(",") if i]
            drop = [i for v in query.get("undeliverable", []) for i in v.split(",") if i]
            self.acked += [i for i in ack if i not in self.acked]
            self.undeliverable += [i for i in drop if i not in self.undeliverable]
            self.pending = [m for m in self.pending if m["id"] not in ack and m["id"] not in drop]
            return Reply(200, {"messages": list(self.pending), "next_poll_s": 0})


def client(url: str, clock: FakeClock) -> ControlPlaneClient:
    return ControlPlaneClient(url, "7", SESSION, clock=clock, sleep=clock.sleep, random=lambda: 0.0)


class FailingInterrupt:
    def interrupt(self) -> None:
        raise ProcessLookupError("no such group")

    def steer(self, message_id: str, line: bytes) -> None:
        raise AssertionError("no steer in this test")


def test_a_batch_that_never_acknowledges_backs_off_1_2_4_8_15_15_seconds() -> None:
    plane = SteerPlane({"id": new_id(), "kind": "interrupt", "body": ""})
    clock = FakeClock()
    events: list[tuple[str, dict]] = []
    with scripted_server(plane) as server:
        # random 1.0: the top of each equal-jitter window, so the windows themselves show.
        loop = SteerLoop(
            client(server.url, clock),
            FailingInterrupt(),
            lambda t, d: events.append((t, d)),
            sleep=clock.sleep,
            random=lambda: 1.0,
        )
        for _ in range(6):
            assert loop.iterate()
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    # An interrupt is never given up on, and nothing was acknowledged.
    assert plane.acked == [] and plane.undeliverable == [] and events == []
    assert loop.attempts[plane.pending[0]["id"]] == 6


def test_equal_jitter_keeps_half_of_each_window() -> None:
    plane = SteerPlane({"id": new_id(), "kind": "interrupt", "body": ""})
    clock = FakeClock()
    with scripted_server(plane) as server:
        loop = SteerLoop(
            client(server.url, clock), FailingInterrupt(), lambda t, d: None, sleep=clock.sleep, random=lambda: 0.0
        )
        for _ in range(6):
            loop.iterate()
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 7.5, 7.5]


JOB_CLOSES_STDIN = """
import os, signal, sys, time
os.close(0)  # the job will take no steering message
hits = []
signal.signal(signal.SIGINT, lambda *a: hits.append(1))
deadline = time.monotonic() + 60
while not hits and time.monotonic() < deadline:
    time.sleep(0.01)
print(f"interrupted {len(hits)}", flush=True)
time.sleep(0.5)
print(f"interrupted {len(hits)}", flush=True)
"""


def test_a_steer_that_keeps_failing_is_dropped_after_3_attempts_and_the_interrupt_behind_it_lands() -> None:
    steer_id, interrupt_id = new_id(), new_id()
    plane = SteerPlane({"id": steer_id, "kind": "steer", "body": "left"})
    child = subprocess.Popen(
        [sys.executable, "-c", JOB_CLOSES_STDIN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(0.3)
    clock = FakeClock()
    events: list[tuple[str, dict]] = []
    try:
        with scripted_server(plane) as server:
            loop = SteerLoop(
                client(server.url, clock),
                JobActor(child.pid, child.stdin.fileno()),
                lambda t, d: events.append((t, d)),
                sleep=clock.sleep,
                random=lambda: 0.0,
            )
            loop.iterate()  # the steer fails once
            plane.pending.append({"id": interrupt_id, "kind": "interrupt", "body": ""})
            loop.iterate()  # the steer fails again; the interrupt behind it lands at once
            assert list(loop.applied) == [("interrupt", interrupt_id)] and loop.to_drop == []
            for _ in range(3):  # the requirement's number, not the constant: a third failure, then the report
                loop.iterate()
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert out.split("\n")[:2] == ["interrupted 1", "interrupted 1"], out
    assert plane.acked == [interrupt_id]
    assert plane.undeliverable == [steer_id]
    assert [t for t, _ in events] == ["steer_undeliverable"]
    assert events[0][1]["id"] == steer_id and events[0][1]["attempts"] == 3
    assert events[0][1]["error"] == "BrokenPipeError"
    assert plane.pending == []


def test_a_served_again_message_is_acknowledged_not_reapplied() -> None:
    message = {"id": new_id(), "kind": "interrupt", "body": ""}
    served = {"n": 0}

    def lose_first_ack(request: Recorded) -> Reply:
        served["n"] += 1
        # The second poll carries the ack, but the server "loses" it: served again.
        return Reply(200, {"messages": [message] if served["n"] <= 2 else [], "next_poll_s": 0})

    class Counting:
        interrupts = 0

        def interrupt(self) -> None:
            Counting.interrupts += 1

        def steer(self, message_id: str, line: bytes) -> None:
            raise AssertionError

    clock = FakeClock()
    with scripted_server(lose_first_ack) as server:
        loop = SteerLoop(client(server.url, clock), Counting(), lambda t, d: None, sleep=clock.sleep)
        for _ in range(3):
            loop.iterate()
        acks = [urllib.parse.parse_qs(urllib.parse.urlsplit(r.path).query).get("ack") for r in server.requests]
    assert Counting.interrupts == 1
    assert acks == [None, [message["id"]], [message["id"]]]
    assert clock.sleeps == []


def test_a_steer_line_is_one_json_line_on_the_jobs_stdin() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print(sys.stdin.readline(), end='')"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    plane = SteerPlane({"id": new_id(), "kind": "steer", "body": 'go "left"\n'})
    clock = FakeClock()
    with scripted_server(plane) as server:
        loop = SteerLoop(
            client(server.url, clock), JobActor(child.pid, child.stdin.fileno()), lambda t, d: None, sleep=clock.sleep
        )
        loop.iterate()
        loop.iterate()
    out, _ = child.communicate(timeout=30)
    assert json.loads(out) == {"id": plane.acked[0], "kind": "steer", "body": 'go "left"\n'}
    assert out.count("\n") == 1


def test_failed_polls_are_survived_and_reported_once_when_the_transport_returns() -> None:
    state = {"down": True}

    def flaky(request: Recorded) -> Reply:
        if state["down"]:  # a final answer the transport does not retry: the poll fails
            return Reply(400, {"error": {"code": "bad_request", "message": ""}})
        return Reply(200, {"messages": [], "next_poll_s": 0})

    clock = FakeClock()
    events: list[tuple[str, dict]] = []
    with scripted_server(flaky) as server:
        loop = SteerLoop(
            client(server.url, clock),
            FailingInterrupt(),
            lambda t, d: events.append((t, d)),
            sleep=clock.sleep,
            random=lambda: 1.0,
        )
        assert loop.iterate() and loop.iterate()
        state["down"] = False
        for _ in range(4):
            assert loop.iterate()
    assert [t for t, _ in events] == ["steer_poll_degraded"]
    assert events[0][1]["failed_polls"] == 2
    assert events[0][1]["since"] <= events[0][1]["until"]
    assert clock.sleeps == [1.0, 2.0]


def test_the_loop_ends_when_the_run_is_terminal() -> None:
    terminal = Reply(409, {"error": {"code": "run_terminal", "message": ""}, "status": "cancelled"})
    clock = FakeClock()
    with scripted_server([terminal]) as server:
        loop = SteerLoop(client(server.url, clock), FailingInterrupt(), lambda t, d: None, sleep=clock.sleep)
        loop.run()
        assert len(server.requests) == 1


def test_a_long_steered_runner_remembers_a_bounded_number_of_landed_ids():
    """Each steer line that landed is remembered (a re-served one is not written twice),
    but only the latest HANDLED_MEMORY: a run steered for weeks must not grow without
    bound."""
    from runner.steer import HANDLED_MEMORY

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfor _ in sys.stdin: pass"], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        actor = JobActor(child.pid, child.stdin.fileno())
        for n in range(HANDLED_MEMORY + 50):
            actor.steer(f"m{n}", b"x\n")
        assert len(actor._landed) == HANDLED_MEMORY
        assert "m0" not in actor._landed and f"m{HANDLED_MEMORY + 49}" in actor._landed
    finally:
        child.stdin.close()
        child.wait(timeout=10)
