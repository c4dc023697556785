"""One execution's child process: spawn it isolated, collect its output, enforce its
wall clock, kill its whole tree on timeout or cancel.

The child chain is ``[isolation prefix] python -I exec_wrapper.py SPEC`` -> ``python -I
main.py``: the prefix (``unshare``/``bwrap``, or nothing) gives namespaces, the wrapper
applies rlimits and drops privileges, the last exec runs the user's code with an empty
environment in its own temp dir.

Errors::

    ChildError            the child could not be started (nothing ran)
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from . import defaults
from .protocol import MAX_OUTPUT_BYTES, truncate_output

WRAPPER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exec_wrapper.py")
SNIPPET_NAME = "main.py"


class ChildError(OSError):
    """The child could not be started; no user code ran."""


@dataclass(frozen=True)
class Limits:
    timeout_ms: int
    memory_mb: int
    max_processes: int = defaults.DEFAULT_MAX_PROCESSES
    max_file_bytes: int = defaults.DEFAULT_MAX_FILE_BYTES
    max_open_files: int = defaults.DEFAULT_MAX_OPEN_FILES
    max_output_bytes: int = MAX_OUTPUT_BYTES


@dataclass(frozen=True)
class Outcome:
    status: str  # succeeded | failed | timed_out | cancelled
    exit_code: int | None
    stdout: str
    stderr: str
    duration_ms: int
    error: str = ""


class _Capped:
    """Keeps the first ``limit`` bytes (+ a few, so truncation is visible) and drops the
    rest while still reading: a child blocked on a full pipe would never exit."""

    def __init__(self, limit: int) -> None:
        self.keep = limit + 4
        self.limit = limit
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        room = self.keep - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def text(self) -> str:
        return truncate_output(self.data.decode("utf-8", errors="replace"), self.limit)


class Child:
    """A started execution. ``wait`` blocks until it ended and returns its outcome."""

    def __init__(
        self, code: str, limits: Limits, *, prefix: list[str], uid: int | None, python: str = sys.executable
    ) -> None:
        self.code = code
        self.python = python
        self.limits = limits
        self.prefix = prefix
        self.uid = uid
        self.tmpdir: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._stop_status = "cancelled"
        self._stop_error = ""

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Create the temp dir and the process. Raises ``ChildError`` if either fails."""
        try:
            self.tmpdir = tempfile.mkdtemp(prefix="holdfast-exec-")
            path = os.path.join(self.tmpdir, SNIPPET_NAME)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(self.code)
            if self.uid is not None:
                os.chown(self.tmpdir, self.uid, self.uid)
                os.chown(path, self.uid, self.uid)
            os.chmod(self.tmpdir, 0o700)
            self.proc = subprocess.Popen(
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},  # the isolation tool itself sees no secrets either
                cwd=self.tmpdir,
                start_new_session=True,  # own session and process group: killpg reaches all
                close_fds=True,
            )
        except OSError as exc:
            self.cleanup()
            raise ChildError(f"could not start the child: {exc.__class__.__name__}") from None

    def _argv(self) -> list[str]:
        limits = self.limits
        cpu_s = -(-limits.timeout_ms // 1000) + defaults.DEFAULT_CPU_MARGIN_S
        spec = {
            "cpu_s": cpu_s,
            "as_bytes": limits.memory_mb * 1024 * 1024,
            "nproc": limits.max_processes,
            "fsize": limits.max_file_bytes,
            "nofile": limits.max_open_files,
            "uid": self.uid,
            "cwd": self.tmpdir,
            "argv": [self.python, "-I", SNIPPET_NAME],
        }
        prefix = [part.replace("{tmpdir}", self.tmpdir or "") for part in self.prefix]
        return [*prefix, sys.executable, "-I", WRAPPER_PATH, json.dumps(spec)]

    def stop(self, status: str, error: str = "") -> None:
        """Ask ``wait`` to kill the child and report ``status`` (cancel, drain expiry)."""
        if not self._stop.is_set():
            self._stop_status, self._stop_error = status, error
            self._stop.set()

    def wait(self) -> Outcome:
        assert self.proc is not None and self.proc.stdout and self.proc.stderr
        started = time.monotonic()
        deadline = started + self.limits.timeout_ms / 1000
        out, err = _Capped(self.limits.max_output_bytes), _Capped(self.limits.max_output_bytes)
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ, out)
        sel.register(self.proc.stderr, selectors.EVENT_READ, err)
        status = error = ""
        exited_at: float | None = None
        try:
            while sel.get_map():
                now = time.monotonic()
                if not status and exited_at is None:
                    if now >= deadline:
                        status, error = "timed_out", f"Execution timed out after {self.limits.timeout_ms} ms"
                        self.kill()
                    elif self._stop.is_set():
                        status, error = self._stop_status, self._stop_error
                        self.kill()
                if exited_at is None and self.proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > defaults.DEFAULT_PIPE_DRAIN_S:
                    break  # something outside the group holds the pipes; stop waiting on it
                wake = min(defaults.DEFAULT_POLL_INTERVAL_S, max(0.0, deadline - now))
                for key, _ in sel.select(timeout=wake):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        key.data.add(chunk)
                    else:
                        sel.unregister(key.fileobj)
            returncode = self.proc.wait()
        finally:
            sel.close()
            self.proc.stdout.close()
            self.proc.stderr.close()
            if status:  # we killed it: make sure nothing of it is left
                self.kill()
            elif self.uid is not None:
                kill_uid(self.uid)  # a background process must not outlive its execution
        duration_ms = int((time.monotonic() - started) * 1000)
        if status:
            return Outcome(status, None, out.text(), err.text(), duration_ms, error)
        if returncode == 0:
            return Outcome("succeeded", 0, out.text(), err.text(), duration_ms)
        if returncode < 0:  # killed by a signal (a CPU or memory rlimit): report it as a shell would
            name = _signal_name(-returncode)
            return Outcome("failed", 128 - returncode, out.text(), err.text(), duration_ms, f"killed by {name}")
        return Outcome("failed", returncode, out.text(), err.text(), duration_ms)

    def kill(self) -> None:
        """SIGKILL the child's process group. With a PID namespace this kills the
        namespace's init, and the kernel then kills every process left inside it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.uid is not None:
            kill_uid(self.uid)  # without a PID namespace, a setsid'd grandchild left the group

    def cleanup(self) -> None:
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def kill_uid(uid: int, *, rounds: int = 20) -> None:
    """SIGKILL every process whose real uid is ``uid`` (the execution slot's own uid, so
    nothing else runs under it). Repeated because a fork bomb forks while we scan."""
    for _ in range(rounds):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                os.kill(int(name), signal.SIGKILL)
                found = True
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
        time.sleep(0.02)  # let the kernel reap what we just killed before scanning again


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
