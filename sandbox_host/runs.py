"""Run sandboxes: ``python -m runner`` started detached, one per run id, for hours.

Rules (DESIGN.md, Runs; docs/protocol.md, "Runs"):

* **Launch is idempotent by run id.** A record is written to the host's state directory
  *before* anything is started, under a lock every thread and host process sharing that
  directory takes. A second launch of a run that has a record (live or exited) starts
  nothing and answers ``already``. The record goes first so that a crash can leave a
  run never started (reconcile fails it later), never started twice.
* **Detached.** The sandbox gets its own session, its output goes to a file, and the
  host keeps no pipe to it: a host restart or drain does not touch it. A restarted host
  with the same state directory probes it by pid and kernel start time.
* **Isolation** is the executions' (PID namespace, unprivileged uid, rlimits, empty
  environment) except the network: the runner must reach the control plane. The
  sandbox's environment is the run id, the run's key (its only secret), the control
  plane's URL, and PATH/PYTHONPATH/HOME/TMPDIR. Never the host token.
* A draining host answers a new launch ``not_started(draining)``: the launch task tries
  again elsewhere. The drain never waits on runs.

State directory (root only, 0700)::

    <state_dir>/lock                 flock around launch, stop and probe
    <state_dir>/runs/<run id>.json   pid, start time, uid, run dir, exit code
    <state_dir>/runs/<run id>.log    the runner's stdout and stderr

Run directory (the sandbox's own, owned by its uid): ``lib/runner`` (a copy of the
runner package: the unprivileged uid cannot read the host's venv), ``tmp``.

Errors: none escape. A launch that cannot start its process answers
``not_started(spawn_failed)`` and removes its record, so a retry may start it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import defaults, protocol, run_uids
from .children import WRAPPER_PATH, kill_uid
from .isolation import Isolation
from .log import log
from .procs import alive, start_time

RUNNER_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runner")
# The variables the sandbox's runner gets (exec_wrapper keeps exactly these).
RUN_ENV_NAMES = (
    "HOLDFAST_RUN_ID",
    "HOLDFAST_RUN_KEY",
    "HOLDFAST_CONTROL_PLANE_URL",
    "PATH",
    "PYTHONPATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "PYTHONUNBUFFERED",
)


def default_state_dir(host_id: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"holdfast-host-{host_id}")


@dataclass(frozen=True)
class RunLimits:
    # Limits
    max_runs: int = defaults.DEFAULT_MAX_RUNS
    memory_mb: int = defaults.DEFAULT_RUN_MEMORY_MB
    cpu_s: int = defaults.DEFAULT_RUN_CPU_S
    max_processes: int = defaults.DEFAULT_MAX_PROCESSES
    max_file_bytes: int = defaults.DEFAULT_MAX_FILE_BYTES
    max_open_files: int = defaults.DEFAULT_MAX_OPEN_FILES


class RunSandboxes:
    def __init__(
        self,
        *,
        state_dir: str,
        isolation: Isolation,
        draining: Callable[[], bool],
        limits: RunLimits | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.isolation = isolation
        self.draining = draining
        self.limits = limits or RunLimits()
        self._runs_dir = os.path.join(state_dir, "runs")
        os.makedirs(self._runs_dir, mode=0o700, exist_ok=True)
        os.chmod(state_dir, 0o700)
        # Only root may claim uids for runs; a non-root host keeps its own (see isolation).
        self._root = isolation.uid_base is not None

    # --- the three operations ----------------------------------------------------

    def launch(self, frame: protocol.LaunchRun) -> protocol.Frame:
        run_id = frame.id
        with self._locked():
            if self._read(run_id) is not None:
                log("run_launch_repeated", id=run_id)
                return protocol.RunLaunched(id=run_id, already=True)
            # Both refusals happen before a record or a process exists: the run never
            # started here, so the control plane may launch it on another host.
            if self.draining():
                log("run_launch_refused", id=run_id, reason="draining")
                return protocol.NotStarted(id=run_id, reason="draining")
            if self._live_count() >= self.limits.max_runs:
                log("run_launch_refused", id=run_id, reason="at_capacity")
                return protocol.NotStarted(id=run_id, reason="at_capacity")
            self._write(run_id, {"run_id": run_id, "launched_at": time.time(), "pid": None})
            try:
                proc, record = self._spawn(frame)
            except (OSError, RuntimeError) as exc:
                self._remove(run_id)  # nothing runs: a retry may start it
                log("run_launch_refused", id=run_id, reason="spawn_failed", error=exc.__class__.__name__)
                return protocol.NotStarted(id=run_id, reason="spawn_failed")
            self._write(run_id, record)
        log(
            "run_launched",
            id=run_id,
            pid=record["pid"],
            uid=record["uid"],
            isolation=self.isolation.name,
            network=True,
        )
        threading.Thread(target=self._reap, args=(proc, record), name=f"run-{run_id}", daemon=True).start()
        return protocol.RunLaunched(id=run_id, already=False)

    def stop(self, run_id: str) -> protocol.RunStopped:
        with self._locked():
            record = self._read(run_id)
            if record is None or not self._alive(record):
                return protocol.RunStopped(id=run_id, was_running=False)
            record["stopped_at"] = time.time()
            self._write(run_id, record)
            with contextlib.suppress(ProcessLookupError):
                # The sandbox's own group: its PID namespace's init dies, and with it
                # everything inside (unshare --kill-child, bwrap).
                os.killpg(record["pid"], signal.SIGKILL)
            if record.get("uid") is not None:
                kill_uid(record["uid"])  # without a PID namespace, what left the group
            # SIGKILL lands asynchronously: answer only once the sandbox is gone, so a
            # probe right after the answer cannot still see it running.
            deadline = time.monotonic() + defaults.DEFAULT_RUN_STOP_WAIT_S
            while self._alive(record) and time.monotonic() < deadline:
                time.sleep(0.02)
        log("run_stopped", id=run_id)
        return protocol.RunStopped(id=run_id, was_running=True)

    def probe(self, frame: protocol.ProbeRuns) -> protocol.RunStatus:
        statuses: dict[str, dict] = {}
        with self._locked():
            for run_id in frame.ids:
                record = self._read(run_id)
                if record is None:
                    statuses[run_id] = {"status": "unknown", "exit_code": None}
                elif "exit_code" in record:
                    statuses[run_id] = {"status": "exited", "exit_code": record["exit_code"]}
                elif self._alive(record):
                    statuses[run_id] = {"status": "running", "exit_code": None}
                else:
                    # Exited while no host of this state dir was its parent (a restart):
                    # its exit code is lost with the old host. Or it never got a pid.
                    statuses[run_id] = {"status": "exited", "exit_code": None}
                    record["exit_code"] = None
                    self._write(run_id, record)
                    self._cleanup(record)
        return protocol.RunStatus(statuses=statuses, ref=frame.ref)

    # --- starting one ------------------------------------------------------------

    def _spawn(self, frame: protocol.LaunchRun) -> tuple[subprocess.Popen, dict]:
        run_dir = tempfile.mkdtemp(prefix="holdfast-run-")
        try:
            lib = os.path.join(run_dir, "lib")
            shutil.copytree(RUNNER_SOURCE, os.path.join(lib, "runner"), ignore=shutil.ignore_patterns("__pycache__"))
            tmp = os.path.join(run_dir, "tmp")
            os.mkdir(tmp, 0o700)
            log_path = os.path.join(self._runs_dir, f"{frame.id}.log")
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                if self._root:
                    with run_uids.registry() as registry:
                        uid = registry.claim()
                        kill_uid(uid)  # a lingering process of a former holder must not share it
                        proc = self._popen(frame, run_dir, lib, tmp, log_fd, uid)
                        registry.record(uid, proc.pid, start_time(proc.pid))
                else:
                    uid = None
                    proc = self._popen(frame, run_dir, lib, tmp, log_fd, uid)
            finally:
                os.close(log_fd)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        record = {
            "run_id": frame.id,
            "pid": proc.pid,
            "start_time": start_time(proc.pid),
            "uid": uid,
            "run_dir": run_dir,
            "launched_at": time.time(),
        }
        return proc, record

    def _popen(self, frame: protocol.LaunchRun, run_dir: str, lib: str, tmp: str, log_fd: int, uid: int | None):
        if uid is not None:
            for path in (run_dir, tmp):
                os.chown(path, uid, uid)
        os.chmod(run_dir, 0o700)
        limits = self.limits
        spec = {
            "cpu_s": limits.cpu_s,
            "as_bytes": limits.memory_mb * 1024 * 1024,
            "nproc": limits.max_processes,
            "fsize": limits.max_file_bytes,
            "nofile": limits.max_open_files,
            "uid": uid,
            "cwd": run_dir,
            # -s: no user site; PYTHONPATH (the copied package) is how it finds the runner.
            "argv": [self.isolation.python, "-s", "-m", "runner"],
            "env_names": list(RUN_ENV_NAMES),
        }
        # The key travels in the environment, never in argv (``ps`` shows argv to every
        # user). The environment of a root-owned process is readable by root only.
        env = {
            "HOLDFAST_RUN_ID": frame.id,
            "HOLDFAST_RUN_KEY": frame.key,
            "HOLDFAST_CONTROL_PLANE_URL": frame.control_plane_url,
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": lib,
            "HOME": run_dir,
            "TMPDIR": tmp,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        prefix = [part.replace("{tmpdir}", run_dir) for part in self.isolation.for_runs()]
        return subprocess.Popen(
            [*prefix, sys.executable, "-I", WRAPPER_PATH, json.dumps(spec)],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            env=env,
            cwd=run_dir,
            # Detached: its own session, so the host's signals and exit do not reach it.
            start_new_session=True,
            close_fds=True,
        )

    def _reap(self, proc: subprocess.Popen, record: dict) -> None:
        """While this host lives it is the sandbox's parent: record its exit code."""
        code = proc.wait()
        with self._locked():
            current = self._read(record["run_id"]) or record
            current["exit_code"] = code
            current["finished_at"] = time.time()
            self._write(record["run_id"], current)
            self._cleanup(current)
        log("run_exited", id=record["run_id"], exit_code=code)

    def _cleanup(self, record: dict) -> None:
        uid = record.get("uid")
        if uid is not None:
            with run_uids.registry() as registry:
                # Only while the claim is still this run's: once its process died another
                # run may have claimed the uid, and sweeping it would kill that run.
                if registry.release_if_held_by(uid, record.get("pid"), record.get("start_time")):
                    kill_uid(uid)  # nothing of the run may outlive it under its uid
        if record.get("run_dir"):
            shutil.rmtree(record["run_dir"], ignore_errors=True)

    # --- records -----------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # A fresh open per use: flock locks belong to an open file, so two threads of
        # this host exclude each other as two host processes do.
        fd = os.open(os.path.join(self.state_dir, "lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _path(self, run_id: str) -> str:
        return os.path.join(self._runs_dir, f"{run_id}.json")

    def _read(self, run_id: str) -> dict | None:
        try:
            with open(self._path(run_id)) as fh:
                return json.load(fh)
        except FileNotFoundError:
            return None
        except ValueError:
            # A torn write cannot happen (rename below); an unreadable record still
            # proves a launch was attempted, so it must not allow a second one.
            return {"run_id": run_id, "pid": None}

    def _write(self, run_id: str, record: dict) -> None:
        path = self._path(run_id)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(record, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # atomic: a reader sees the old record or the new one

    def _remove(self, run_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(run_id))

    @staticmethod
    def _alive(record: dict) -> bool:
        pid = record.get("pid")
        return isinstance(pid, int) and "exit_code" not in record and alive(pid, record.get("start_time"))

    def _live_count(self) -> int:
        count = 0
        for name in os.listdir(self._runs_dir):
            if name.endswith(".json"):
                record = self._read(name[: -len(".json")])
                count += bool(record and self._alive(record))
        return count
