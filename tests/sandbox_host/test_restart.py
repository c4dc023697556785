"""A host restarted with the same state directory after a SIGKILL: its live runs keep
their way out (a new relay when the old one is gone) and report their real exit code;
what a dead host left behind (control groups, old execution dirs, dead runs' files) is
removed without touching anything live."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from holdfast_wire import protocol
from sandbox_host import cgroups, defaults
from tests.integration.support import stop_runs
from tests.runner.servers import scripted_server
from tests.support.host import connect, start_host
from tests.timing import wait_until

from .conftest import TOKEN
from .test_runs import ControlPlane, _launch, _probe

pytestmark = pytest.mark.peer


@pytest.fixture
def state_dir(tmp_path):
    yield tmp_path
    stop_runs(tmp_path)


def test_a_live_run_gets_its_way_out_back_and_its_real_exit_code_after_a_host_sigkill(state_dir):
    plane = ControlPlane("echo started; sleep 4; echo after; exit 3")
    run_id = str(uuid.uuid4())
    args = ("--state-dir", str(state_dir))
    with scripted_server(plane) as cp:
        with start_host(TOKEN, host_id="h-relay", extra_args=args) as first:
            ws = connect(first.url, TOKEN)
            assert _launch(ws, run_id, cp.url) == protocol.RunLaunched(id=run_id, already=False)
            wait_until(lambda: plane.lines == ["started"], timeout=30, what="the job to start")
            ws.close()
            record = json.loads((state_dir / "runs" / f"{run_id}.json").read_text())
            os.kill(first.pid, signal.SIGKILL)  # no drain, no clean-up
            first.popen.wait()
            os.kill(record["relay"][0], signal.SIGKILL)  # and the run's way out with it
        with start_host(TOKEN, host_id="h-relay", extra_args=args) as second:
            wait_until(lambda: plane.results, timeout=60, what="the run's result through the new relay")
            assert "event=run_relay_restarted" in second.log()
            ws = connect(second.url, TOKEN)
            try:
                wait_until(lambda: _probe(ws, run_id)[run_id]["status"] == "exited", timeout=20, what="the exit")
                # Not this host's child: the code comes from the status file bubblewrap wrote.
                assert _probe(ws, run_id)[run_id] == {"status": "exited", "exit_code": 1}
            finally:
                ws.close()
    assert plane.lines == ["started", "after"]
    assert [r["exit_code"] for r in plane.results] == [3]
    assert len(plane.hellos) == 1


def test_a_starting_host_removes_what_a_dead_host_left(state_dir):
    groups, why = cgroups.detect()
    # The last execution block: no host of this machine holds it.
    uid = defaults.DEFAULT_CHILD_UID_BASE + (defaults.DEFAULT_UID_BLOCKS - 1) * defaults.DEFAULT_UID_BLOCK_SIZE + 5
    left_groups = list(groups.paths(f"exec-{uid}").values()) if groups.enabled else []
    for path in left_groups:
        os.makedirs(path, exist_ok=True)
    old_dir = Path(f"/tmp/holdfast-exec-{uuid.uuid4().hex[:8]}")
    old_dir.mkdir()
    (old_dir / "main.py").write_text("print('left')")
    os.chown(old_dir, uid, uid)
    # A run whose sandbox died while no host ran: its process is gone, its status file
    # says how it ended, and its files are still there.
    dead = subprocess.Popen(["true"])
    dead.wait()
    run_id = str(uuid.uuid4())
    runs = state_dir / "runs"
    runs.mkdir(parents=True)
    run_dir = state_dir / "left-run-dir"
    run_dir.mkdir()
    (runs / f"{run_id}.json").write_text(
        json.dumps({"run_id": run_id, "pid": dead.pid, "start_time": 1, "uid": None, "run_dir": str(run_dir)})
    )
    (runs / f"{run_id}.status").write_text('{"child-pid": 2}\n{"exit-code": 7}\n')
    try:
        with start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
            ws = connect(host.url, TOKEN)
            try:
                assert _probe(ws, run_id)[run_id] == {"status": "exited", "exit_code": 7}
            finally:
                ws.close()
            assert not old_dir.exists()
            assert not any(os.path.exists(path) for path in left_groups), why
            assert not run_dir.exists()
            assert "event=leftovers_removed" in host.log()
    finally:
        for path in left_groups:
            if os.path.isdir(path):
                os.rmdir(path)
        shutil.rmtree(old_dir, ignore_errors=True)


def test_a_starting_host_prunes_old_exited_runs_and_keeps_recent_ones(state_dir):
    runs = state_dir / "runs"
    runs.mkdir(parents=True)
    old_exit = time.time() - defaults.DEFAULT_RUN_RECORD_RETENTION_S - 60
    kept = {"recent": time.time() - 60}
    gone = subprocess.Popen(["true"])
    gone.wait()
    for run_id, finished in {"ancient": old_exit, **kept}.items():
        # A pid no process has (and a start time none could have): never a live one.
        record = {"run_id": run_id, "pid": gone.pid, "start_time": 1, "exit_code": 0, "finished_at": finished}
        (runs / f"{run_id}.json").write_text(json.dumps(record))
        (runs / f"{run_id}.log").write_text("runner: event=finished\n")
    with start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
        ws = connect(host.url, TOKEN)
        try:
            statuses = _probe(ws, "ancient", "recent")
        finally:
            ws.close()
    assert statuses["ancient"]["status"] == "unknown" and statuses["recent"] == {"status": "exited", "exit_code": 0}
    assert sorted(p.name for p in runs.iterdir()) == ["recent.json", "recent.log"]
