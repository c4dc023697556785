"""Reconcile against real sandbox hosts through the real WebSocket driver (issue 9,
tests 4, 5 and 6): a host that does not answer, a sandbox SIGKILLed, a host restarted
with the same id and state dir, a launch message lost, a runner that never starts.

Real processes only: hosts (tests/support/host.py), a Celery worker launching through
the WebSocket driver, the web process the runners call, PostgreSQL and Redis. Ticks run
in this process, through the same driver settings the worker uses."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings as django_settings

from controlplane.runs import actions, reconcile
from controlplane.runs.dispatch import enqueue_launch_on_commit
from controlplane.runs.host_driver import WebSocketLaunchDriver
from controlplane.runs.models import Run, RunStatus
from sandbox_host.procs import alive
from tests.integration.conftest import counting_job
from tests.integration.support import free_port, run_log, start_web
from tests.support.scripted import scripted_host
from tests.support.worker import WorkerProcess, start_worker
from tests.timing import scaled, wait_until

from .hosts import HOST_ID, TOKEN, RestartableHost

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.peer]


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup):
    with start_web(tmp_path_factory.mktemp("web")) as process:
        yield process


@contextlib.contextmanager
def worker_for(host: RestartableHost, control_plane_url: str) -> Iterator[WorkerProcess]:
    env = {
        "HOLDFAST_CELERY_QUEUE": django_settings.CELERY_TASK_DEFAULT_QUEUE,
        "HOLDFAST_SANDBOX_URL": host.url,
        "HOLDFAST_SANDBOX_TOKEN": TOKEN,
        "HOLDFAST_RUNS_LAUNCH_DRIVER": "",
        "HOLDFAST_CONTROL_PLANE_URL": control_plane_url,
        "HOLDFAST_RUNS_LAUNCH_RETRY_DELAY_S": "1",
    }
    with start_worker(env, concurrency=2) as worker:
        yield worker


def _status(run_id: object) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def _tick_until(predicate, *, timeout: float, what: str):
    """Tick every half second (a short interval) until ``predicate`` holds."""

    def once():
        reconcile.tick()
        return predicate()

    return wait_until(once, timeout=timeout, interval=0.5, what=what)


# --- test 4: a host that does not answer -----------------------------------------------


def test_a_silent_host_leaves_its_runs_unstamped_and_an_answering_host_stamps_an_unknown_run(drive_host, settings):
    dead = f"ws://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    settings.SANDBOX_URL = f"{drive_host.url},{dead}"
    on_gone = actions.create_run("acme", {"kind": "shell", "command": "true"})
    on_real = actions.create_run("acme", {"kind": "shell", "command": "true"})
    for run, host_id in ((on_gone, "host-that-is-gone"), (on_real, HOST_ID)):
        actions.claim_for_launch(run.id)
        Run.objects.filter(pk=run.id).update(host_id=host_id)

    report = reconcile.tick()

    assert report.silent_hosts == ["host-that-is-gone"]
    assert report.probed == {"host-that-is-gone": 1, HOST_ID: 1}
    assert Run.objects.get(pk=on_gone.id).loss_observed_at is None  # not knowing is not a loss
    assert report.stamped == [str(on_real.id)]  # the real host has no record of it
    from controlplane.hosts import probe_log

    seen = probe_log.entries()
    assert seen["host-that-is-gone"]["silent_since"] is not None and seen["host-that-is-gone"]["silent_ticks"] >= 1
    assert seen[HOST_ID]["silent_since"] is None and seen[HOST_ID]["last_answer_at"] is not None


def test_one_probe_frame_per_thousand_runs_on_one_connection_answers_every_run(drive_host):
    """A host with more runs than one frame may name is asked in several frames on the
    same connection, and every run gets an answer (the real host's probe path)."""
    driver = WebSocketLaunchDriver.from_settings()
    ids = [uuid.uuid4().hex for _ in range(2345)]
    answers = driver.probe({HOST_ID: ids})
    assert set(answers) == {HOST_ID} and set(answers[HOST_ID]) == set(ids)
    assert {p.status for p in answers[HOST_ID].values()} == {"unknown"}
    probes = [line for line in drive_host.process.log_lines if "connection_authenticated" in line]
    assert len(probes) == 1, probes


def test_behind_a_balancer_the_prober_dials_until_it_has_found_every_host(tmp_path):
    """One address (a balancer) in front of two hosts: the prober dials it again until
    both hosts answered for their own runs, each once."""
    from holdfast_devtools.balancer import TcpBalancer

    first = RestartableHost(tmp_path / "a", free_port(), "lb-host-a")
    second = RestartableHost(tmp_path / "b", free_port(), "lb-host-b")
    first.start()
    second.start()
    try:
        with TcpBalancer() as balancer:
            balancer.add_target("a", ("127.0.0.1", first.port))
            balancer.add_target("b", ("127.0.0.1", second.port))
            driver = WebSocketLaunchDriver(
                urls=(f"ws://127.0.0.1:{balancer.address[1]}",),
                token=TOKEN,
                connect_timeout_s=5,
                reply_timeout_s=5,
                probe_timeout_s=5,
            )
            answers = driver.probe({"lb-host-a": ["r-a"], "lb-host-b": ["r-b"]})
        assert {host: set(statuses) for host, statuses in answers.items()} == {
            "lb-host-a": {"r-a"},
            "lb-host-b": {"r-b"},
        }
    finally:
        first.stop()
        second.stop()


# --- test 5: end to end ----------------------------------------------------------------


@pytest.mark.slow
def test_a_sigkilled_sandbox_fails_as_sandbox_lost_after_the_grace(drive_host, web, settings):
    settings.SANDBOX_LOSS_GRACE_S = 2.0
    host = drive_host
    with worker_for(host, web.url):
        run = actions.create_run("acme", {"kind": "python", "source": counting_job(600, 0.2), "timeout_s": 300})
        enqueue_launch_on_commit(run.id)
        wait_until(lambda: _status(run.id) == RunStatus.RUNNING, timeout=60, what="the run to start")
        assert reconcile.tick().alive == 1
        os.killpg(host.record(run.id)["pid"], signal.SIGKILL)
        failed = _tick_until(
            lambda: Run.objects.filter(pk=run.id, status=RunStatus.FAILED).first(), timeout=30, what="sandbox_lost"
        )
    assert failed.error.startswith("sandbox_lost"), failed.error
    assert failed.loss_observed_at is not None
    assert (failed.finished_at - failed.loss_observed_at).total_seconds() >= 2.0  # never before the grace
    assert failed.key_revoked_at is not None and failed.secrets == {}
    assert failed.events.filter(type="result").count() == 1


@pytest.mark.slow
def test_a_host_restarted_with_the_same_id_and_state_dir_keeps_its_run_which_finishes(drive_host, web, settings):
    settings.SANDBOX_LOSS_GRACE_S = 2.0
    host = drive_host
    with worker_for(host, web.url):
        run = actions.create_run("acme", {"kind": "python", "source": counting_job(30, 0.5), "timeout_s": 300})
        enqueue_launch_on_commit(run.id)
        wait_until(lambda: run.events.count() >= 3, timeout=60, what="the run to stream")
        host.stop()  # SIGTERM: the host exits, the run's sandbox does not
        silent = reconcile.tick()
        assert silent.silent_hosts == [HOST_ID] and not silent.stamped
        time.sleep(scaled(3))  # longer than the grace: silence must not turn into a loss
        assert not reconcile.tick().stamped
        host.start()
        seen = reconcile.tick()
        assert seen.alive == 1 and not seen.stamped, seen.lines()
        done = _tick_until(lambda: Run.objects.get(pk=run.id).is_terminal, timeout=60, what="the run to finish")
    run = Run.objects.get(pk=run.id)
    assert done and run.status == RunStatus.SUCCEEDED, (run.error, run_log(host.state_dir, run.id))
    assert run.exit_code == 0 and run.loss_observed_at is None


@pytest.mark.slow
def test_a_restarted_host_reports_the_real_exit_code_of_a_sandbox_it_adopted(drive_host, web, settings):
    """The restarted host is not the sandbox's parent; it still reports the exit code the
    sandbox really had (the host persists it: sandbox_host/runs.py)."""
    host = drive_host
    with worker_for(host, web.url):
        run = actions.create_run("acme", {"kind": "python", "source": counting_job(10, 0.5), "timeout_s": 300})
        enqueue_launch_on_commit(run.id)
        wait_until(lambda: run.events.count() >= 2, timeout=60, what="the run to stream")
        host.stop()
        host.start()  # no longer the sandbox's parent
        wait_until(lambda: Run.objects.get(pk=run.id).is_terminal, timeout=60, what="the run to finish")
        pid = host.record(run.id)["pid"]
        wait_until(lambda: not alive(pid, None), timeout=30, what="the sandbox to exit")
    answer = WebSocketLaunchDriver.from_settings().probe({HOST_ID: [str(run.id)]})
    probe = answer[HOST_ID][str(run.id)]
    assert (probe.status, probe.exit_code) == ("exited", 0)


# --- test 6: deadlines -----------------------------------------------------------------


@pytest.mark.slow
def test_a_lost_launch_message_is_launched_by_the_deadline_path(drive_host, web, settings):
    settings.RUN_LAUNCH_DEADLINE_S = 1.0
    run = actions.create_run("acme", {"kind": "shell", "command": "echo launched-late", "timeout_s": 60})
    enqueue_launch_on_commit(run.id)  # autocommit: published at once
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    assert broker.llen(django_settings.CELERY_TASK_DEFAULT_QUEUE) == 1
    broker.delete(django_settings.CELERY_TASK_DEFAULT_QUEUE)  # the message is lost
    with worker_for(drive_host, web.url):
        time.sleep(scaled(2))
        assert _status(run.id) == RunStatus.QUEUED
        report = reconcile.tick()
        assert report.relaunched == [str(run.id)]
        assert reconcile.tick().relaunched == []  # once
        wait_until(lambda: Run.objects.get(pk=run.id).is_terminal, timeout=60, what="the relaunched run to finish")
    run = Run.objects.get(pk=run.id)
    assert run.status == RunStatus.SUCCEEDED, (run.error, run_log(drive_host.state_dir, run.id))
    assert run.relaunched_at is not None and run.host_id == HOST_ID


@pytest.mark.slow
def test_a_runner_that_never_starts_fails_as_launch_lost_and_its_sandbox_is_stopped(drive_host, settings):
    settings.RUN_LAUNCH_DEADLINE_S = 2.0
    nowhere = f"http://127.0.0.1:{free_port()}"  # its runner retries hello against nothing
    with worker_for(drive_host, nowhere):
        run = actions.create_run("acme", {"kind": "shell", "command": "echo never", "timeout_s": 60})
        enqueue_launch_on_commit(run.id)
        wait_until(lambda: Run.objects.get(pk=run.id).host_id, timeout=60, what="the launch")
        assert reconcile.tick().alive == 1  # its sandbox runs: not a loss, just no hello
        relaunched = _tick_until(lambda: Run.objects.get(pk=run.id).relaunched_at, timeout=30, what="relaunch")
        assert relaunched
        failed = _tick_until(
            lambda: Run.objects.filter(pk=run.id, status=RunStatus.FAILED).first(), timeout=30, what="launch_lost"
        )
        assert failed.error.startswith("launch_lost"), failed.error
        pid = drive_host.record(run.id)["pid"]
        wait_until(lambda: not alive(pid, None), timeout=30, what="the stop task to kill the sandbox")
    assert drive_host.record(run.id).get("stopped_at") is not None


@contextlib.contextmanager
def newer_host(statuses: dict[str, dict]) -> Iterator[str]:
    """A scripted host on port 0 playing a newer host: it authenticates anyone
    and answers every ``probe_runs`` with ``statuses``."""

    from holdfast_wire import protocol

    def handler(conn) -> None:
        conn.recv()  # auth
        conn.send(protocol.encode(protocol.AuthOk(host_id="newer-host", isolation=protocol.FULL_ISOLATION)))
        for message in conn:
            frame = protocol.decode(message)
            conn.send(protocol.encode(protocol.RunStatus(statuses=statuses, ref=frame.ref)))

    with scripted_host(handler) as url:
        yield url


def test_a_status_the_prober_cannot_read_leaves_that_run_untouched_and_the_rest_judged():
    """A newer host may answer a status this release does not know: that proves nothing
    about the run, which is left out; the host's other answers still count."""
    answers = {"a": {"status": "hibernating", "exit_code": None}, "b": {"status": "exited", "exit_code": 3}}
    with newer_host(answers) as url:
        driver = WebSocketLaunchDriver(urls=(url,), token="t", connect_timeout_s=5, reply_timeout_s=5)
        statuses = driver.probe({"newer-host": ["a", "b"]})["newer-host"]
    assert set(statuses) == {"b"} and (statuses["b"].status, statuses["b"].exit_code) == ("exited", 3)
