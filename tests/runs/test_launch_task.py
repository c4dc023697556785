"""The launch task in a real Celery worker process: dispatched after commit, claimed by
compare-and-set, retried safely, and failing the run cleanly when no host takes it."""

from __future__ import annotations

import io
import json

import pytest
from django.conf import settings
from django.core.management import call_command

from controlplane.runs import actions
from controlplane.runs.models import Run, RunStatus
from controlplane.runs.tasks import launch_run
from tests.support.worker import start_worker
from tests.timing import wait_until

from .conftest import JOB, RunnerCalls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.peer]


@pytest.fixture(scope="module")
def launch_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("launches")


@pytest.fixture(scope="module")
def worker(launch_dir, django_db_setup):
    env = {
        "HOLDFAST_CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
        "HOLDFAST_RUNS_LAUNCH_DRIVER": "tests.runs.fake_host.RecordingHost",
        "HOLDFAST_TEST_LAUNCH_DIR": str(launch_dir),
        "HOLDFAST_RUNS_LAUNCH_RETRY_DELAY_S": "0",
        "HOLDFAST_RUNS_LAUNCH_MAX_ATTEMPTS": "3",
        "HOLDFAST_CONTROL_PLANE_URL": "http://127.0.0.1:9/cp",
    }
    with start_worker(env, concurrency=1) as process:
        yield process


def test_create_run_command_dispatches_on_commit_and_the_host_gets_a_working_key(worker, launch_dir, client):
    out = io.StringIO()
    call_command("create_run", "--owner", "acme", "--shell", "echo hi", "--secret", "TOKEN=abcdefghijk", stdout=out)
    run_id = out.getvalue().strip()
    record = launch_dir / f"{run_id}.launched"
    wait_until(record.exists, what="the fake host to record the launch")
    wait_until(lambda: Run.objects.get(pk=run_id).host_id == "fake-host-1", what="host_id recorded")
    launched = json.loads(record.read_text())
    assert launched["url"] == "http://127.0.0.1:9/cp"
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.PROVISIONING and run.sandbox_ref == f"sbx-{run_id}"
    hello = RunnerCalls(client, run_id).post("hello", {"instance_id": "i-1"}, token=launched["key"])
    assert hello.status_code == 200
    assert launched["key"] not in worker.output() and "abcdefghijk" not in worker.output()


def test_an_unavailable_host_is_asked_again_and_launches_once(worker, launch_dir):
    run = actions.create_run("acme", JOB, {})
    (launch_dir / f"{run.id}.fail").write_text("2")
    launch_run.delay(str(run.id))
    wait_until((launch_dir / f"{run.id}.launched").exists, what="launch after two refusals")
    assert (launch_dir / f"{run.id}.attempts").read_text() == "3"
    wait_until(lambda: Run.objects.get(pk=run.id).host_id == "fake-host-1", what="host_id recorded")
    assert Run.objects.get(pk=run.id).status == RunStatus.PROVISIONING


def test_a_redelivered_launch_message_starts_no_second_sandbox(worker, launch_dir):
    run = actions.create_run("acme", JOB, {})
    launch_run.delay(str(run.id))
    launch_run.delay(str(run.id))
    wait_until(lambda: (launch_dir / f"{run.id}.attempts").exists(), what="first launch")
    wait_until(lambda: (launch_dir / f"{run.id}.attempts").read_text() == "2", what="second delivery")
    assert (launch_dir / f"{run.id}.launched").exists()
    assert Run.objects.get(pk=run.id).status == RunStatus.PROVISIONING


def test_a_run_no_host_will_take_fails_with_its_keys_revoked(worker, launch_dir):
    run = actions.create_run("acme", JOB, {})
    (launch_dir / f"{run.id}.fail").write_text("99")
    launch_run.delay(str(run.id))
    wait_until(lambda: Run.objects.get(pk=run.id).status == RunStatus.FAILED, what="the run to fail")
    run.refresh_from_db()
    assert run.error == "launch failed: launch_unavailable after 3 attempt(s)"
    assert run.key_revoked_at is not None and run.receipt is not None


def test_a_cancelled_run_is_never_launched(worker, launch_dir):
    run = actions.create_run("acme", JOB, {})
    actions.cancel_run(run.id)
    launch_run.delay(str(run.id))
    marker = actions.create_run("acme", JOB, {})
    launch_run.delay(str(marker.id))  # the queue is FIFO per worker slot: wait for a later one
    wait_until((launch_dir / f"{marker.id}.launched").exists, what="a later launch")
    assert not (launch_dir / f"{run.id}.attempts").exists()
