"""Run sandboxes: ``python -m runner`` started detached, one per run id, for hours.

Rules (DESIGN.md, Runs; docs/protocol.md, "Runs"):

* **Launch is idempotent by run id.** A record is written to the host's state directory
  *before* anything is started, under a lock every thread and host process sharing that
  directory takes. A second launch of a run that has a record (live or exited) starts
  nothing and answers ``already``. The record goes first so that a crash can leave a
  run never started (reconcile fails it later), never started twice.
* **Detached.** The sandbox gets its own session, its output goes to a file, and the
  host keeps no pipe to it: a host restart or drain does not touch it. A restarted host
  with the same state directory probes it by pid and kernel start time, and reads its
  exit code from the status file bubblewrap writes when it ends (so a run that ended
  while no host was its parent still reports its real exit code).
* **Containment** is the executions' (``sandbox.py``: private read-only root, one capped
  tmpfs, PID/mount/IPC/UTS/network namespaces, the run's own uid, no capabilities,
  no_new_privs, seccomp, control groups) with its own network namespace and no way out
  but ``/holdfast/sock/api.sock``: a Unix socket that the run's relay (``relay.py``)
  connects to the control plane's address and nowhere else. The relay runs under the
  run's uid and in its control groups, and survives a host restart like the sandbox; a
  restarted host starts a new one if it is gone.
* **The key** reaches the runner through a pipe (``HOLDFAST_RUN_KEY_FD``), never an
  environment, a file or a command line; the runner reads it after making itself
  non-dumpable, so the job (its child, same uid) cannot read it from /proc, and the
  seccomp filter refuses ptrace and process_vm_readv. Never the host token.
* A draining host answers a new launch ``not_started(draining)``: the launch task tries
  again elsewhere. The drain never waits on runs.

State directory (root only, 0700)::

    <state_dir>/lock                 flock around launch, stop and probe
    <state_dir>/runs/<run id>.json   pid, start time, uid, relay, exit code
    <state_dir>/runs/<run id>.log    the runner's and the relay's stdout and stderr
    <state_dir>/runs/<run id>.status bubblewrap's JSON status (the exit code)
    /run/holdfast-relay/<digest>/sock the relay's socket, bound into the sandbox (a
                                     short path: a socket's must fit in 108 bytes)

Errors: none escape. A launch that cannot start its process answers
``not_started(spawn_failed)`` and removes its record, so a retry may start it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from holdfast_wire import protocol

from . import defaults, run_uids, sandbox, seccomp_policy
from .children import WRAPPER_PATH, kill_uid
from .isolation import Isolation
from .log import log
from .procs import alive, start_time

RUNNER_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runner")
# The wire package (standard library only): the runner logs in its logfmt style.
WIRE_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "holdfast_wire")
RELAY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")
# Inside the sandbox: the runner's and the wire's packages and the relay's socket, all
# read-only binds.
SANDBOX_LIB = f"{sandbox.HOLDFAST_DIR}/lib"
SANDBOX_SOCK_DIR = f"{sandbox.HOLDFAST_DIR}/sock"
SOCKET_NAME = "api.sock"
# The runner's interpreter flags. -s: no user site; -B: its package is a read-only bind;
# -P: the working directory (/tmp, which the job writes) is never on the runner's path,
# or a job could plant a module that the key-holding runner imports later.
RUNNER_FLAGS = ("-s", "-B", "-P")


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
    scratch_bytes: int = defaults.DEFAULT_RUN_SCRATCH_BYTES
    relay_max_connections: int = defaults.DEFAULT_RELAY_MAX_CONNECTIONS


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
        self._next_prune = 0.0

    # --- the three operations ----------------------------------------------------

    def launch(self, frame: protocol.LaunchRun) -> protocol.Frame:
        run_id = frame.id
        if time.monotonic() >= self._next_prune:
            self.prune()
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
            network="relay",
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
            if record.get("cgroup"):
                self.isolation.cgroups.kill(record["cgroup"])
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
                    # bubblewrap wrote its exit code to the status file. Or it never got a pid.
                    code = self._status_exit_code(run_id) if record.get("pid") is not None else None
                    statuses[run_id] = {"status": "exited", "exit_code": code}
                    record["exit_code"] = code
                    record["finished_at"] = time.time()
                    self._write(run_id, record)
                    self._cleanup(record)
        return protocol.RunStatus(statuses=statuses, ref=frame.ref)

    # --- starting one ------------------------------------------------------------

    def _spawn(self, frame: protocol.LaunchRun) -> tuple[subprocess.Popen, dict]:
        run_dir = _run_dir(self.state_dir, frame.id)
        shutil.rmtree(run_dir, ignore_errors=True)  # a leftover of a launch that never started
        sock_dir = os.path.join(run_dir, "sock")
        os.makedirs(sock_dir, mode=0o755)
        log_path = os.path.join(self._runs_dir, f"{frame.id}.log")
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            if self._root:
                with run_uids.registry() as registry:
                    uid = registry.claim()
                    kill_uid(uid)  # a lingering process of a former holder must not share it
                    proc, relay = self._start(frame, run_dir, sock_dir, log_fd, uid)
                    registry.record(uid, proc.pid, start_time(proc.pid))
            else:
                uid = None
                proc, relay = self._start(frame, run_dir, sock_dir, log_fd, uid)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        finally:
            os.close(log_fd)
        record = {
            "run_id": frame.id,
            "pid": proc.pid,
            "start_time": start_time(proc.pid),
            "uid": uid,
            "run_dir": run_dir,
            "cgroup": self._cgroup_name(uid),
            "relay": _relay_identity(relay),
            "target": list(_target(frame.control_plane_url)),
            "launched_at": time.time(),
        }
        threading.Thread(target=relay.wait, name=f"relay-{frame.id}", daemon=True).start()
        return proc, record

    def _cgroup_name(self, uid: int | None) -> str:
        return f"run-{uid}" if uid is not None and self.isolation.cgroups.enabled else ""

    def _start(
        self, frame: protocol.LaunchRun, run_dir: str, sock_dir: str, log_fd: int, uid: int | None
    ) -> tuple[subprocess.Popen, subprocess.Popen]:
        """Start the sandbox, then its relay; both detached."""
        limits = self.limits
        joins: list[str] = []
        cgroup = self._cgroup_name(uid)
        if cgroup:
            joins = self.isolation.cgroups.create(
                cgroup,
                memory_bytes=limits.memory_mb * 1024 * 1024,
                max_processes=limits.max_processes,
                cpus=defaults.DEFAULT_RUN_CPUS,
            )
        listener = _listen(os.path.join(sock_dir, SOCKET_NAME), uid)
        fds: list[int] = []
        try:
            key_read, key_write = os.pipe()
            fds.append(key_read)
            # A key is far below a pipe's buffer: this never blocks.
            os.write(key_write, frame.key.encode())
            os.close(key_write)
            status_fd = os.open(self._status_path(frame.id), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            fds.append(status_fd)
            seccomp_fd = None
            if self.isolation.sandboxed:
                seccomp_fd = seccomp_policy.program_fd(self.isolation.seccomp)
                fds.append(seccomp_fd)
            env = {
                "HOLDFAST_RUN_ID": frame.id,
                "HOLDFAST_RUN_KEY_FD": str(key_read),
                "HOLDFAST_CONTROL_PLANE_URL": frame.control_plane_url,
                "HOLDFAST_CONTROL_PLANE_SOCKET": f"{SANDBOX_SOCK_DIR}/{SOCKET_NAME}",
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "PYTHONPATH": SANDBOX_LIB,
                "HOME": sandbox.SCRATCH,
                "TMPDIR": sandbox.SCRATCH,
                "LANG": "C.UTF-8",
                "PYTHONUNBUFFERED": "1",
            }
            command, args_fd = sandbox.hide_arguments(
                self.isolation.command(
                    uid=uid,
                    code_fd=None,
                    seccomp_fd=seccomp_fd,
                    command=[self.isolation.python, *RUNNER_FLAGS, "-m", "runner"],
                    scratch_bytes=limits.scratch_bytes,
                    env=env,
                    die_with_parent=False,  # detached: the run survives its host
                    ro_binds=(
                        (RUNNER_SOURCE, f"{SANDBOX_LIB}/runner"),
                        (WIRE_SOURCE, f"{SANDBOX_LIB}/holdfast_wire"),
                        (sock_dir, SANDBOX_SOCK_DIR),
                    ),
                    status_fd=status_fd,
                )
            )
            if args_fd is not None:
                fds.append(args_fd)
            spec = {
                "cgroups": joins,
                "rlimits": {
                    "cpu_s": limits.cpu_s,
                    "as_bytes": limits.memory_mb * 1024 * 1024,
                    "nproc": limits.max_processes,
                    "fsize": limits.max_file_bytes,
                    "nofile": limits.max_open_files,
                    "core": 0,
                },
                "argv": command,
            }
            proc = _detached([sys.executable, "-I", "-S", WRAPPER_PATH, json.dumps(spec)], log_fd, tuple(fds))
            relay = self._start_relay(listener, frame.control_plane_url, proc.pid, uid, joins, log_fd)
        finally:
            listener.close()
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return proc, relay

    def _start_relay(
        self, listener: socket.socket, url: str, sandbox_pid: int, uid: int | None, joins: list[str], log_fd: int
    ) -> subprocess.Popen:
        spec = {
            "listen_fd": listener.fileno(),
            "target": list(_target(url)),
            "sandbox": [sandbox_pid, start_time(sandbox_pid)],
            "uid": uid,
            "cgroups": joins,
            "max_connections": self.limits.relay_max_connections,
        }
        return _detached([sys.executable, "-I", RELAY_PATH, json.dumps(spec)], log_fd, (listener.fileno(),))

    def adopt(self) -> None:
        """At start-up: give every live run of this state dir its way out again (a relay
        that died with the machine's last host), and finish the records of runs that
        ended while no host watched (their exit code, their uid, cgroup and files)."""
        with self._locked():
            for name in os.listdir(self._runs_dir):
                if not name.endswith(".json"):
                    continue
                record = self._read(name[: -len(".json")])
                if record is None or "exit_code" in record:
                    continue
                if self._alive(record):
                    if record.get("relay") and not alive(*record["relay"]) and record.get("target"):
                        self._restart_relay(record)
                elif record.get("pid") is not None:
                    record["exit_code"] = self._status_exit_code(record["run_id"])
                    record["finished_at"] = time.time()
                    self._write(record["run_id"], record)
                    self._cleanup(record)
                    log("run_exited_unwatched", id=record["run_id"], exit_code=record["exit_code"])

    def prune(self, *, now: float | None = None) -> int:
        """Remove the files of runs that exited more than the retention ago. Returns how
        many runs it removed. A live run, or one whose exit is recent, is never touched."""
        now = time.time() if now is None else now
        self._next_prune = time.monotonic() + defaults.DEFAULT_RUN_PRUNE_INTERVAL_S
        cutoff = now - defaults.DEFAULT_RUN_RECORD_RETENTION_S
        removed = 0
        with self._locked():
            for name in os.listdir(self._runs_dir):
                if not name.endswith(".json"):
                    continue
                run_id = name[: -len(".json")]
                record = self._read(run_id)
                if record is None or "exit_code" not in record:
                    continue
                if float(record.get("finished_at") or record.get("launched_at") or now) > cutoff:
                    continue
                for suffix in (".log", ".status", ".json"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self._runs_dir, run_id + suffix))
                removed += 1
        if removed:
            log("run_records_pruned", runs=removed)
        return removed

    def _restart_relay(self, record: dict) -> None:
        sock_dir = os.path.join(record["run_dir"], "sock")
        uid = record.get("uid")
        listener = _listen(os.path.join(sock_dir, SOCKET_NAME), uid)
        cgroup = record.get("cgroup") or ""
        joins = (
            [os.path.join(p, "cgroup.procs") for p in self.isolation.cgroups.paths(cgroup).values()] if cgroup else []
        )
        log_fd = os.open(os.path.join(self._runs_dir, f"{record['run_id']}.log"), os.O_WRONLY | os.O_APPEND)
        try:
            host, port = record["target"]
            relay = self._start_relay(listener, f"http://{host}:{port}", record["pid"], uid, joins, log_fd)
        finally:
            listener.close()
            os.close(log_fd)
        threading.Thread(target=relay.wait, name=f"relay-{record['run_id']}", daemon=True).start()
        record["relay"] = _relay_identity(relay)
        self._write(record["run_id"], record)
        log("run_relay_restarted", id=record["run_id"])

    def _reap(self, proc: subprocess.Popen, record: dict) -> None:
        """While this host lives it is the sandbox's parent: record its exit code."""
        code = proc.wait()
        with self._locked():
            current = self._read(record["run_id"]) or record
            status_code = self._status_exit_code(record["run_id"])
            current["exit_code"] = status_code if status_code is not None else code
            current["finished_at"] = time.time()
            self._write(record["run_id"], current)
            self._cleanup(current)
        log("run_exited", id=record["run_id"], exit_code=current["exit_code"])

    def _status_path(self, run_id: str) -> str:
        return os.path.join(self._runs_dir, f"{run_id}.status")

    def _status_exit_code(self, run_id: str) -> int | None:
        """The runner's exit code as bubblewrap wrote it when the sandbox ended, whoever
        was its parent then; None if it never got that far (killed with its bwrap)."""
        try:
            with open(self._status_path(run_id)) as fh:
                text = fh.read()
        except OSError:
            return None
        code = None
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                document = json.loads(line)
                if isinstance(document, dict) and isinstance(document.get("exit-code"), int):
                    code = document["exit-code"]
        return code

    def _cleanup(self, record: dict) -> None:
        uid = record.get("uid")
        if record.get("relay") and alive(*record["relay"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record["relay"][0], signal.SIGKILL)
        if uid is not None:
            with run_uids.registry() as registry:
                # Only while the claim is still this run's: once its process died another
                # run may have claimed the uid (and so the group named after it), and
                # sweeping either would kill that run.
                if registry.release_if_held_by(uid, record.get("pid"), record.get("start_time")):
                    if record.get("cgroup"):
                        self.isolation.cgroups.remove(record["cgroup"])  # the relay included
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


def _run_dir(state_dir: str, run_id: str) -> str:
    """Where a run's relay socket lives. Not under the state dir: a Unix socket's path
    must fit in 108 bytes, and a state dir may be long. Named by a digest of both, so two
    hosts (two state dirs) never share one, and a restarted host finds it again."""
    base = "/run/holdfast-relay" if os.geteuid() == 0 and os.path.isdir("/run") else None
    if base is None:
        base = os.path.join(tempfile.gettempdir(), f"holdfast-relay-{os.geteuid()}")
    os.makedirs(base, mode=0o755, exist_ok=True)
    digest = hashlib.sha256(f"{os.path.realpath(state_dir)}\0{run_id}".encode()).hexdigest()[:24]
    return os.path.join(base, digest)


def _detached(argv: list[str], log_fd: int, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    """Start a process of a run (its sandbox's wrapper, its relay) with an empty
    environment, output to the run's log, in its own session: the host's signals and
    exit do not reach it."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=log_fd,
        env={},
        cwd="/",
        start_new_session=True,
        close_fds=True,
        pass_fds=pass_fds,
    )


def _target(url: str) -> tuple[str, int]:
    """The one address a run's relay connects to: the control plane URL's host and port."""
    parsed = urllib.parse.urlsplit(url)
    return parsed.hostname or "127.0.0.1", parsed.port or (443 if parsed.scheme == "https" else 80)


def _listen(path: str, uid: int | None) -> socket.socket:
    """The relay's listening socket at ``path``, connectable by the run's uid only."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        if uid is not None:
            os.chown(path, uid, uid)
        os.chmod(path, 0o600)
        listener.listen(64)
    except BaseException:
        listener.close()
        raise
    return listener


def _relay_identity(proc: subprocess.Popen) -> list:
    return [proc.pid, start_time(proc.pid)]
