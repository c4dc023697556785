"""Steering end to end with real processes: ``steering.send`` (what ``manage.py interrupt``
and ``steer`` call) -> PostgreSQL NOTIFY -> the web process under uvicorn (the steer long
poll) -> a proxy -> the host's relay -> the runner in its sandbox -> SIGINT / a stdin line
to the job. Faults are real: the proxy cuts a response after the server committed, and the
web process is SIGKILLed and started again on the same port."""

from __future__ import annotations

import threading

import pytest

from controlplane.runs import actions, steering
from controlplane.runs.dispatch import enqueue_launch_on_commit
from controlplane.runs.models import Run, RunEvent, RunStatus, SteerMessage
from tests.timing import scaled, wait_until

from .conftest import launching_worker, stdout_lines
from .steer_support import CuttingProxy, start_asgi_web
from .support import run_log, wait_seconds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.peer]

# A job that counts the SIGINTs it gets (it never dies of one), echoes each steering line,
# and ends a second after the steer "stop", printing its total.
STEERABLE_JOB = """
import json, signal, sys, threading, time
count = [0]
signal.signal(signal.SIGINT, lambda *a: count.__setitem__(0, count[0] + 1))
done = threading.Event()
def read():
    for line in sys.stdin:
        body = json.loads(line)["body"]
        print(f"steer {body}", flush=True)
        if body == "stop":
            done.set()
threading.Thread(target=read, daemon=True).start()
print("ready", flush=True)
seen = 0
deadline = time.monotonic() + 280
while not done.is_set() and time.monotonic() < deadline:
    if count[0] != seen:
        seen = count[0]
        print(f"sigint {seen}", flush=True)
    time.sleep(0.02)
time.sleep(1)
print(f"total sigints {count[0]}", flush=True)
"""

# Closes its stdin at once: no steering message can land. Ends a while after its SIGINT,
# long enough for a failing steer's three attempts (1 s + 2 s of backoff).
STDIN_CLOSED_JOB = """
import os, signal, time
os.close(0)
hits = []
signal.signal(signal.SIGINT, lambda *a: hits.append(1))
print("ready", flush=True)
deadline = time.monotonic() + 280
while not hits and time.monotonic() < deadline:
    time.sleep(0.02)
print("interrupted", flush=True)
time.sleep(15)
print(f"total sigints {len(hits)}", flush=True)
"""


class Cuts:
    """What the proxy cuts next; set per test."""

    def __init__(self) -> None:
        self.when = lambda path, body: False
        self.then = lambda path: None

    def cut_when(self, path: str, body: bytes) -> bool:
        return self.when(path, body)

    def on_cut(self, path: str) -> None:
        self.then(path)


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup):
    with start_asgi_web(tmp_path_factory.mktemp("web-steer")) as process:
        yield process


@pytest.fixture(scope="module")
def cuts() -> Cuts:
    return Cuts()


@pytest.fixture(scope="module")
def proxy(web, cuts):
    with CuttingProxy(web.port, cuts.cut_when, cuts.on_cut) as running:
        yield running


@pytest.fixture(scope="module")
def worker(host, proxy, django_db_setup):
    with launching_worker(host, proxy.url) as process:
        yield process


@pytest.fixture(autouse=True)
def _no_cuts(cuts):
    yield
    cuts.when = lambda path, body: False
    cuts.then = lambda path: None


def _start(source: str) -> Run:
    run = actions.create_run("acme", {"kind": "python", "source": source, "timeout_s": 300})
    enqueue_launch_on_commit(run.id)
    wait_until(lambda: "ready" in stdout_lines(run.id), timeout=90, what="the job to start")
    return run


def _finished(run_id: object) -> Run:
    def done() -> Run | None:
        run = Run.objects.get(pk=run_id)
        return run if run.is_terminal else None

    return wait_until(done, timeout=120, what="the run to finish")


def _restart_later(web, delay_s: float) -> threading.Thread:
    def restart() -> None:
        wait_seconds(delay_s)
        web.start()

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    return thread


def test_the_web_dying_mid_response_on_the_interrupts_poll_applies_it_exactly_once(
    worker, web, proxy, cuts, state_dir, capsys
):
    run = _start(STEERABLE_JOB)
    target: dict[str, str] = {}
    restarts: list[threading.Thread] = []

    def when(path: str, body: bytes) -> bool:
        mid = target.get("id")
        if "/steer" not in path or not mid:
            return False
        # 1: the poll serving the interrupt; 2: the poll acknowledging it (ack committed).
        first = mid.encode() in body and not proxy.cuts
        second = f"ack={mid}" in path and len(proxy.cuts) == 1
        return first or second

    def then(path: str) -> None:
        web.kill()  # dies with its answer half sent
        restarts.append(_restart_later(web, 3))

    cuts.when, cuts.then = when, then
    sent = steering.send(run.id, "interrupt")
    target["id"] = sent.id
    wait_until(lambda: len(proxy.cuts) == 2, timeout=120, what="both cuts")
    for thread in list(restarts):
        thread.join(scaled(60))
    wait_until(
        lambda: SteerMessage.objects.get(pk=sent.id).delivered_at, timeout=120, what="the interrupt acknowledged"
    )
    steering.send(run.id, "steer", "stop")
    run = _finished(run.id)
    lines = stdout_lines(run.id)
    assert run.status == RunStatus.SUCCEEDED, (run.error, run_log(state_dir, run.id))
    assert [line for line in lines if "sigint" in line] == ["sigint 1", "total sigints 1"], lines
    assert "steer stop" in lines
    row = SteerMessage.objects.get(pk=sent.id)
    assert row.attempts >= 2, "the interrupt's first answer was cut, so it must have been served again"
    with capsys.disabled():
        print(f"\n[steer cut x2, web killed x2] sigints=1 attempts={row.attempts} web_starts={web.starts}")


def test_a_steer_the_job_cannot_take_is_dropped_after_3_attempts_and_the_interrupt_behind_it_lands(
    worker, web, state_dir, capsys
):
    run = _start(STDIN_CLOSED_JOB)
    stuck = steering.send(run.id, "steer", "you will not read this")
    interrupt = steering.send(run.id, "interrupt")
    run = _finished(run.id)
    assert run.status == RunStatus.SUCCEEDED, (run.error, run_log(state_dir, run.id))
    assert "total sigints 1" in stdout_lines(run.id)
    undeliverable = list(RunEvent.objects.filter(run=run, type="steer_undeliverable").values_list("data", flat=True))
    assert len(undeliverable) == 1, undeliverable
    assert undeliverable[0]["id"] == stuck.id and undeliverable[0]["attempts"] == 3
    stuck.refresh_from_db()
    interrupt.refresh_from_db()
    assert (stuck.ended, stuck.delivered_at) == ("undeliverable", None)
    assert interrupt.delivered_at is not None and interrupt.ended == ""
    with capsys.disabled():
        print(f"\n[stdin closed] steer served {stuck.attempts}x, dropped with one event; interrupt delivered")


def test_the_web_killed_and_restarted_during_a_parked_poll_loses_nothing_and_reports_one_degraded_window(
    worker, web, state_dir, capsys
):
    run = _start(STEERABLE_JOB)
    wait_seconds(2)  # the runner's poll is parked in the web process now (a 20 s long poll)
    web.kill()
    during = steering.send(run.id, "steer", "sent while the web was down")
    wait_seconds(5)
    web.start()  # the same port
    wait_until(
        lambda: SteerMessage.objects.get(pk=during.pk).delivered_at, timeout=120, what="the steer after the restart"
    )
    steering.send(run.id, "steer", "stop")
    run = _finished(run.id)
    log = run_log(state_dir, run.id)
    assert run.status == RunStatus.SUCCEEDED, (run.error, log)
    lines = stdout_lines(run.id)
    assert lines.count("steer sent while the web was down") == 1, lines
    assert lines.count("steer stop") == 1
    degraded = list(RunEvent.objects.filter(run=run, type="steer_poll_degraded").values_list("data", flat=True))
    assert len(degraded) == 1, degraded
    assert degraded[0]["retries"] >= 1 and degraded[0]["since"] <= degraded[0]["until"]
    with capsys.disabled():
        print(f"\n[web killed under a parked poll] degraded={degraded[0]} retries_in_log={log.count('event=retry')}")
