"""Event batching against a real HTTP server that deduplicates by batch key, as the
control plane does; outages are real closed ports and responses cut after the commit."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from typing import Any

import pytest

from runner.events import EventStream, pump_lines
from runner.redact import REDACTED, Redactor
from runner.transport import ControlPlaneClient, ServerRejected
from tests.runner.servers import CutBody, FakeClock, Recorded, Reply, closed_port, scripted_server
from tests.timing import scaled, wait_until

pytestmark = pytest.mark.peer


class EventsEndpoint:
    """The server's contract for POST events: append a batch once per batch key, answer a
    replay with the original answer. ``cut_after_commit`` answers chosen requests (by
    index) with a body cut mid-read AFTER appending, the worst ambiguous loss."""

    def __init__(self, cut_after_commit: frozenset[int] = frozenset()) -> None:
        self.events: list[dict[str, Any]] = []
        self.answers: dict[str, dict[str, int]] = {}
        self.bodies_by_key: dict[str, list[bytes]] = {}
        self.requests = 0
        self._cut = cut_after_commit
        self._lock = threading.Lock()

    def __call__(self, request: Recorded) -> Reply | CutBody:
        body = request.json()
        with self._lock:
            index = self.requests
            self.requests += 1
            key = body["batch_key"]
            self.bodies_by_key.setdefault(key, []).append(request.body)
            if key not in self.answers:
                self.answers[key] = {"first_seq": len(self.events), "count": len(body["events"])}
                self.events.extend(body["events"])
            answer = self.answers[key]
        return CutBody() if index in self._cut else Reply(200, answer)


def client_for(url: str, clock: FakeClock) -> ControlPlaneClient:
    return ControlPlaneClient(url, "run-1", "session-token", clock=clock, sleep=clock.sleep, random=lambda: 0.5)


def test_events_keep_order_through_an_outage_and_land_once_with_one_batch_key() -> None:
    """The control plane is down (refused) when output starts, comes back on the same port,
    and then loses two answers after committing: every event lands once, in order, and each
    replay carried the same batch key and bytes."""
    port = closed_port()
    endpoint = EventsEndpoint(cut_after_commit=frozenset({0, 3}))
    clock = FakeClock()
    with contextlib.ExitStack() as stack:

        def come_back(count: int) -> None:
            if count == 5:
                stack.enter_context(scripted_server(endpoint, port=port))

        clock.on_sleep = come_back
        stream = EventStream(client_for(f"http://127.0.0.1:{port}", clock), batch_max_events=7, max_pending_events=14)
        for i in range(200):
            assert stream.emit("stdout", {"line": str(i)})
        assert stream.close(timeout_s=scaled(30)) is None
    assert [e["data"]["line"] for e in endpoint.events] == [str(i) for i in range(200)]
    assert stream.sent == 200
    replayed = [bodies for bodies in endpoint.bodies_by_key.values() if len(bodies) > 1]
    assert len(replayed) == 2
    assert all(len(set(bodies)) == 1 for bodies in replayed)


def test_batches_respect_the_count_and_byte_limits() -> None:
    endpoint = EventsEndpoint()
    with scripted_server(endpoint) as server:
        stream = EventStream(client_for(server.url, FakeClock()), batch_max_events=10, batch_max_bytes=3000)
        for i in range(60):
            stream.emit("stdout", {"line": f"{i:04d}" + "x" * 400})
        stream.close(timeout_s=scaled(10))
    sizes = [answer["count"] for answer in endpoint.answers.values()]
    assert sum(sizes) == 60
    # ~450 encoded bytes per event: 3000 bytes holds 6, never the 10 the count allows.
    assert max(sizes) <= 6


def test_producer_blocks_while_the_buffer_is_full_and_resumes_when_the_batch_lands() -> None:
    """Single flight: with one batch held in flight, emit blocks once the buffer is full."""
    release = threading.Event()
    endpoint = EventsEndpoint()

    def held(request: Recorded) -> Reply | CutBody:
        release.wait(scaled(10))
        return endpoint(request)

    with scripted_server(held) as server:
        stream = EventStream(client_for(server.url, FakeClock()), batch_max_events=5, max_pending_events=5)
        stream.emit("stdout", {"line": "first"})
        wait_until(lambda: endpoint.requests == 0 and server.requests, what="first batch in flight")
        for i in range(5):
            stream.emit("stdout", {"line": str(i)})
        blocked = threading.Thread(target=stream.emit, args=("stdout", {"line": "blocked"}))
        blocked.start()
        blocked.join(scaled(0.3))
        assert blocked.is_alive(), "emit should block while the buffer is full"
        release.set()
        blocked.join(scaled(10))
        assert not blocked.is_alive()
        stream.close(timeout_s=scaled(10))
    assert [e["data"]["line"] for e in endpoint.events] == ["first", "0", "1", "2", "3", "4", "blocked"]


def test_a_drain_that_fails_for_good_releases_producers_and_reports_once() -> None:
    release = threading.Event()

    def too_large(request: Recorded) -> Reply:
        release.wait(scaled(10))
        return Reply(413, {"error": {"code": "too_large", "message": "no"}})

    failures: list[Exception] = []
    with scripted_server(too_large) as server:
        stream = EventStream(client_for(server.url, FakeClock()), batch_max_events=2, max_pending_events=2)
        stream.on_failure(failures.append)
        stream.emit("stdout", {"line": "a"})
        wait_until(lambda: server.requests, what="first batch in flight")
        stream.emit("stdout", {"line": "b"})
        stream.emit("stdout", {"line": "c"})
        blocked = threading.Thread(target=stream.emit, args=("stdout", {"line": "d"}))
        blocked.start()
        release.set()
        blocked.join(scaled(10))
        assert not blocked.is_alive(), "a failed drain must not leave a producer blocked"
        assert stream.emit("stdout", {"line": "after"}) is False
        failure = stream.close(timeout_s=scaled(10))
    assert isinstance(failure, ServerRejected) and failure.code == "too_large"
    assert failures == [failure]
    late: list[Exception] = []
    stream.on_failure(late.append)
    assert late == [failure]
    assert len(server.requests) == 1


def test_a_child_flooding_its_pipe_still_exits_after_the_drain_fails() -> None:
    """A real child writes far more than a pipe holds; the drain fails for good; the reader
    keeps reading (discarding), so the child is never stuck on a full pipe and exits."""
    with scripted_server([Reply(400, {"error": {"code": "bad_request", "message": "no"}})]) as server:
        stream = EventStream(client_for(server.url, FakeClock()), batch_max_events=5, max_pending_events=5)
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys\nfor i in range(200000): sys.stdout.write('x' * 60 + '\\n')"],
            stdout=subprocess.PIPE,
        )
        assert child.stdout is not None
        reader = threading.Thread(target=pump_lines, args=(child.stdout, stream, "stdout"))
        reader.start()
        try:
            assert child.wait(timeout=scaled(60)) == 0
        finally:
            child.kill()
            reader.join(scaled(30))
            child.stdout.close()
        assert not reader.is_alive()
        assert isinstance(stream.close(timeout_s=scaled(10)), ServerRejected)
    assert stream.dropped > 190000


def test_events_are_redacted_before_they_are_buffered() -> None:
    endpoint = EventsEndpoint()
    with scripted_server(endpoint) as server:
        stream = EventStream(client_for(server.url, FakeClock()), redactor=Redactor(["hunter2-hunter2"]))
        stream.emit("stdout", {"line": "pw is hunter2-hunter2", "hunter2-hunter2": 1})
        stream.close(timeout_s=scaled(10))
    assert endpoint.events[0]["data"] == {"line": f"pw is {REDACTED}", REDACTED: 1}


@pytest.mark.parametrize("bad", [0, 1])
def test_buffer_must_hold_a_batch(bad: int) -> None:
    with pytest.raises(ValueError):
        EventStream(client_for("http://127.0.0.1:9", FakeClock()), batch_max_events=2, max_pending_events=bad)
