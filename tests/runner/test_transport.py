"""The runner's transport against real HTTP servers on 127.0.0.1, with an injected clock."""

from __future__ import annotations

import contextlib
import threading

import pytest

from runner import backoff
from runner.policy import ENDPOINT_POLICIES
from runner.transport import (
    ControlPlaneClient,
    NotReplaySafe,
    OutageExceeded,
    RateLimited,
    RunTerminal,
    ServerRejected,
)
from tests.runner.servers import CutBody, FakeClock, Reply, Reset, closed_port, scripted_server

pytestmark = pytest.mark.peer

REPLAY_SAFE = sorted(name for name, policy in ENDPOINT_POLICIES.items() if policy.replay_safe)
# Not in the table: gets the conservative default.
UNKNOWN = "mystery"
OK = Reply(200, {"ok": True})


def make_client(url: str, clock: FakeClock, *, random_value: float = 0.0, **kwargs: object) -> ControlPlaneClient:
    return ControlPlaneClient(
        url, "run-1", "launch-key-123456", clock=clock, sleep=clock.sleep, random=lambda: random_value, **kwargs
    )


def post(client: ControlPlaneClient, endpoint: str) -> object:
    return client.call("POST", endpoint, body={"batch_key": "k-1", "events": []})


@pytest.mark.parametrize("endpoint", [*sorted(ENDPOINT_POLICIES), UNKNOWN])
def test_refused_then_listening_on_same_port_is_retried_for_every_endpoint(endpoint: str) -> None:
    """A refused connect proves nothing reached a handler: every endpoint retries it, and the
    call lands once a new server listens on the same port."""
    port = closed_port()
    clock = FakeClock()
    with contextlib.ExitStack() as stack:
        servers = []

        def listen(count: int) -> None:
            if count == 2:
                servers.append(stack.enter_context(scripted_server([OK], port=port)))

        clock.on_sleep = listen
        client = make_client(f"http://127.0.0.1:{port}", clock)
        assert post(client, endpoint) == {"ok": True}
        assert len(clock.sleeps) == 2
        assert len(servers[0].requests) == 1


def test_503_503_200_recovers_for_replay_safe_endpoint() -> None:
    clock = FakeClock()
    with scripted_server([Reply(503), Reply(503), OK]) as server:
        assert make_client(server.url, clock).call("GET", "bundle") == {"ok": True}
    assert len(server.requests) == 3
    # Equal jitter with random 0: half of each window, 0.5 s then 1 s.
    assert clock.sleeps == [0.25, 0.5]


def test_conservative_endpoint_fails_on_first_503_after_one_request() -> None:
    clock = FakeClock()
    with scripted_server([Reply(503), OK]) as server:
        with pytest.raises(NotReplaySafe) as err:
            post(make_client(server.url, clock), UNKNOWN)
    assert err.value.status == 503
    assert len(server.requests) == 1
    assert clock.sleeps == []


@pytest.mark.parametrize("action", [CutBody(), Reset()], ids=["body-cut", "reset"])
def test_conservative_endpoint_fails_on_ambiguous_loss_after_exactly_one_request(action: object) -> None:
    clock = FakeClock()
    with scripted_server([action, OK]) as server:
        with pytest.raises(NotReplaySafe) as err:
            post(make_client(server.url, clock), UNKNOWN)
    assert err.value.status is None
    assert len(server.requests) == 1


@pytest.mark.parametrize("endpoint", REPLAY_SAFE)
def test_200_cut_mid_body_is_replayed_with_the_same_request_for_replay_safe(endpoint: str) -> None:
    """Reading the body is inside the classification: headers then one byte of a promised
    100, then a destroyed socket, is an ambiguous loss, replayed with identical bytes."""
    clock = FakeClock()
    with scripted_server([CutBody(), OK]) as server:
        assert post(make_client(server.url, clock), endpoint) == {"ok": True}
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body


def test_raw_body_cut_mid_read_is_replayed_and_returns_bytes() -> None:
    clock = FakeClock()
    with scripted_server([CutBody(), Reply(200, b"\x00state-bytes")]) as server:
        got = make_client(server.url, clock).call("GET", "bundle", raw=True)
    assert got == b"\x00state-bytes"
    assert len(server.requests) == 2


def test_reset_before_answer_is_replayed_for_replay_safe() -> None:
    clock = FakeClock()
    with scripted_server([Reset(), OK]) as server:
        assert post(make_client(server.url, clock), "result") == {"ok": True}
    assert len(server.requests) == 2


def test_read_timeout_is_ambiguous() -> None:
    """A stalled answer may follow a committed request: not replayed for a conservative endpoint."""
    release = threading.Event()

    def stall(request: object) -> Reply:
        release.wait(5)
        return OK

    clock = FakeClock()
    with scripted_server(stall) as server:
        try:
            with pytest.raises(NotReplaySafe) as err:
                post(make_client(server.url, clock, read_timeout_s=0.2), UNKNOWN)
        finally:
            release.set()
    assert "TimeoutError" in err.value.detail
    assert len(server.requests) == 1


def test_retry_after_zero_does_not_shorten_the_backoff() -> None:
    clock = FakeClock()
    with scripted_server([Reply(503, headers={"Retry-After": "0"}), OK]) as server:
        make_client(server.url, clock).call("GET", "bundle")
    assert clock.sleeps == [0.25]


def test_large_retry_after_is_honoured() -> None:
    clock = FakeClock()
    with scripted_server([Reply(503, headers={"Retry-After": "30"}), OK]) as server:
        make_client(server.url, clock).call("GET", "bundle")
    assert clock.sleeps == [30.0]


def test_retry_after_beyond_the_budget_is_capped_at_what_remains() -> None:
    clock = FakeClock()
    with scripted_server([Reply(503, headers={"Retry-After": "100000"})]) as server:
        with pytest.raises(OutageExceeded):
            make_client(server.url, clock).call("GET", "bundle")
    assert clock.sleeps == [backoff.DEFAULT_OUTAGE_BUDGET_S]
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("endpoint", "budget"),
    [("bundle", backoff.DEFAULT_OUTAGE_BUDGET_S), ("result", backoff.DEFAULT_RESULT_OUTAGE_BUDGET_S)],
)
def test_budget_bounds_total_time_and_is_spent_in_full(endpoint: str, budget: float) -> None:
    clock = FakeClock()
    with scripted_server([Reply(503)]) as server:
        with pytest.raises(OutageExceeded) as err:
            make_client(server.url, clock, random_value=0.999).call("POST", endpoint, body={})
    assert sum(clock.sleeps) == pytest.approx(budget)
    assert err.value.attempts == len(server.requests) == len(clock.sleeps) + 1
    # The window grew to its cap and stayed there.
    assert max(clock.sleeps[:-1]) <= backoff.DEFAULT_BACKOFF_MAX_S


def test_refused_for_the_whole_budget_ends_in_outage_exceeded() -> None:
    clock = FakeClock()
    client = make_client(f"http://127.0.0.1:{closed_port()}", clock)
    with pytest.raises(OutageExceeded) as err:
        client.call("GET", "bundle")
    assert sum(clock.sleeps) == pytest.approx(backoff.DEFAULT_OUTAGE_BUDGET_S)
    assert "ConnectionRefusedError" in err.value.last_error


class StalledFirstAttempt(FakeClock):
    """A clock under which the first attempt stalled past the whole budget."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now if self.reads == 1 else self.now + 10 * backoff.DEFAULT_RESULT_OUTAGE_BUDGET_S


def test_budget_spent_still_grants_one_retry_on_refused() -> None:
    port = closed_port()
    clock = StalledFirstAttempt()
    with pytest.raises(OutageExceeded) as err:
        make_client(f"http://127.0.0.1:{port}", clock).call("GET", "bundle")
    assert err.value.attempts == 2
    assert len(clock.sleeps) == 1

    clock = StalledFirstAttempt()
    with contextlib.ExitStack() as stack:
        clock.on_sleep = lambda n: stack.enter_context(scripted_server([OK], port=port))
        assert make_client(f"http://127.0.0.1:{port}", clock).call("POST", UNKNOWN, body={}) == {"ok": True}


def test_budget_spent_grants_no_retry_on_5xx() -> None:
    clock = StalledFirstAttempt()
    with scripted_server([Reply(503), OK]) as server:
        with pytest.raises(OutageExceeded):
            make_client(server.url, clock).call("GET", "bundle")
    assert len(server.requests) == 1


def test_429_is_retried_outside_the_budget() -> None:
    """Rate-limit waits do not spend the outage budget: 5 x 60 s > 180 s and the call lands."""
    clock = FakeClock()
    limited = Reply(429, {"error": {"code": "rate_limited", "message": ""}}, {"Retry-After": "600"})
    with scripted_server([limited] * 5 + [OK]) as server:
        assert post(make_client(server.url, clock), UNKNOWN) == {"ok": True}
    assert clock.sleeps == [backoff.DEFAULT_RATE_LIMIT_WAIT_MAX_S] * 5
    assert sum(clock.sleeps) > backoff.DEFAULT_OUTAGE_BUDGET_S


def test_429_has_its_own_retry_cap() -> None:
    clock = FakeClock()
    with scripted_server([Reply(429)]) as server:
        with pytest.raises(RateLimited) as err:
            make_client(server.url, clock).call("GET", "bundle")
    assert len(server.requests) == err.value.attempts == backoff.DEFAULT_RATE_LIMIT_RETRIES + 1
    assert clock.sleeps == [backoff.DEFAULT_RATE_LIMIT_WAIT_S] * backoff.DEFAULT_RATE_LIMIT_RETRIES


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "bad_request"),
        (401, "unauthenticated"),
        (404, "not_found"),
        (409, "instance_conflict"),
        (413, "too_large"),
    ],
)
def test_4xx_is_never_retried(status: int, code: str) -> None:
    clock = FakeClock()
    with scripted_server([Reply(status, {"error": {"code": code, "message": "no"}}), OK]) as server:
        with pytest.raises(ServerRejected) as err:
            make_client(server.url, clock).call("GET", "bundle")
    assert (err.value.status, err.value.code) == (status, code)
    assert not isinstance(err.value, RunTerminal)
    assert len(server.requests) == 1
    assert clock.sleeps == []


def test_run_terminal_carries_the_recorded_status() -> None:
    clock = FakeClock()
    body = {"error": {"code": "run_terminal", "message": "run is terminal"}, "status": "failed"}
    with scripted_server([Reply(409, body)]) as server:
        with pytest.raises(RunTerminal) as err:
            make_client(server.url, clock).call("POST", "result", body={"status": "succeeded"})
    assert err.value.recorded_status == "failed"
    assert len(server.requests) == 1


def test_name_resolution_lost_is_retried_even_for_a_conservative_endpoint() -> None:
    clock = StalledFirstAttempt()
    client = make_client("http://holdfast-control-plane.invalid:8000", clock)
    with pytest.raises(OutageExceeded) as err:
        client.call("POST", UNKNOWN, body={})
    assert err.value.attempts == 2
    assert "gaierror" in err.value.last_error


def test_request_shape_path_bearer_and_json() -> None:
    clock = FakeClock()
    with scripted_server([OK]) as server:
        client = make_client(server.url, clock)
        client.authenticate("session-token-abcdef")
        client.call("POST", "events", body={"batch_key": "b", "events": []})
    request = server.requests[0]
    assert request.path == "/internal/runs/run-1/events"
    assert request.headers["Authorization"] == "Bearer session-token-abcdef"
    assert request.headers["Content-Type"] == "application/json"
    assert request.json() == {"batch_key": "b", "events": []}


def test_error_messages_never_carry_the_bearer() -> None:
    clock = FakeClock()
    with scripted_server([Reset()]) as server:
        with pytest.raises(NotReplaySafe) as err:
            make_client(server.url, clock).call("POST", UNKNOWN, body={})
    assert "launch-key" not in str(err.value)


def test_endpoint_must_be_a_bare_name() -> None:
    client = make_client("http://127.0.0.1:9", FakeClock())
    with pytest.raises(ValueError):
        client.call("GET", "../../admin")


def test_429_waits_do_not_spend_the_outage_budget() -> None:
    """Three minutes of rate limiting, then a 503: the budget is still whole, so it is retried."""
    clock = FakeClock()
    limited = Reply(429, headers={"Retry-After": "60"})
    script = [limited, limited, limited, Reply(503), OK]
    with scripted_server(script) as server:
        assert make_client(server.url, clock).call("GET", "bundle") == {"ok": True}
    assert len(server.requests) == 5
