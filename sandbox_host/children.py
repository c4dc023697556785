"""One execution's child: start its sandbox, collect its output, enforce its wall clock,
kill all of it on timeout or cancel.

The chain is ``python -I exec_wrapper.py SPEC`` (host side: control groups, rlimits)
-> ``bwrap`` (the sandbox, ``sandbox.py``) -> ``setpriv`` (the slot's uid, no
capabilities, no_new_privs) -> ``python -I /holdfast/main.py``. The snippet travels in
a memory file descriptor that bubblewrap copies into the sandbox: nothing of an
execution is ever written to the host's disk, so nothing can be left there.

Errors::

    ChildError            the child could not be started (nothing ran)
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from holdfast_wire.protocol import MAX_OUTPUT_BYTES, truncate_output

from . import defaults, sandbox, seccomp_policy, waiter
from .exec_wrapper import RLIMITS
from .template_host import WAITER_PATH, TemplateProcess

if TYPE_CHECKING:
    from .isolation import Isolation
    from .template_host import Template

WRAPPER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exec_wrapper.py")
WAITER_INSIDE = f"{sandbox.HOLDFAST_DIR}/waiter.py"


def snippet_dir() -> str:
    """Where a prepared sandbox's ``/holdfast/main.py`` lives on the host (one file per
    slot uid, bound read-only into the sandbox and filled when its code arrives): in RAM
    (/dev/shm) where there is one, root's alone."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()  # noqa: S108 - made 0711 below
    path = os.path.join(base, f"holdfast-snippets-{os.geteuid()}")
    os.makedirs(path, mode=0o711, exist_ok=True)
    return path


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
class ChildOutcome:
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
    """A started execution. ``wait`` blocks until it ended and returns its outcome.

    A *prepared* child (``code=None``) is a sandbox started ahead of time whose
    interpreter waits for code (``waiter.py``); ``deliver`` hands it one execution's
    code and limits, after which it is an ordinary child. Its ``limits`` until then are
    the ceilings it was started under."""

    def __init__(
        self,
        code: str | None,
        limits: Limits,
        *,
        isolation: Isolation,
        uid: int | None,
        slot: int = -1,
        group_memory_mb: int | None = None,
    ) -> None:
        self.code = code
        self.limits = limits
        # The memory bound its control groups start with: its limits' by default; a
        # prepared child's may be the size the next execution most likely asks for, so
        # ``deliver`` need not rewrite it (reserve.py).
        self.group_memory_mb = limits.memory_mb if group_memory_mb is None else group_memory_mb
        self.isolation = isolation
        self.uid = uid
        self.slot = slot
        self.cgroup = f"exec-{uid}" if uid is not None and isolation.cgroups.enabled else ""
        self.proc: subprocess.Popen[bytes] | TemplateProcess | None = None
        self._feed: int | None = None  # a prepared child's code pipe, our end
        # After delivery: that end, kept open until clean-up, and how much went down it.
        self._fed: int | None = None
        self._fed_bytes = 0
        # Set by ``wait``: it was SIGKILLed, neither by us nor for its memory bound, with
        # every byte of its code unread, so the code provably never ran (killed from
        # outside as it was taken).
        self.died_unread = False
        self._snippet = ""  # a prepared child's /holdfast/main.py, on the host
        self._status: int | None = None  # a prepared child's exit-status pipe, our end
        self._ended_early = False  # reported at its exit status; the sandbox may still be going
        self._stop = threading.Event()
        self._stop_status = "cancelled"
        self._stop_error = ""

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Start the sandbox. Raises ``ChildError`` if it cannot (nothing ran)."""
        if self.isolation.template is not None:
            self._start_from_template(self.isolation.template)
            return
        fds: list[int] = []
        try:
            if self.code is None:  # prepared: the code comes later, down a pipe
                code_fd, self._feed = os.pipe()
                fds.append(code_fd)
                # Its exit status comes back down another, before the sandbox's teardown.
                self._status, status_fd = os.pipe()
                fds.append(status_fd)
                inner = [self.isolation.python, "-I", WAITER_INSIDE, str(code_fd), str(status_fd)]
                self._snippet = self._new_snippet()
                ro_binds: tuple[tuple[str, str], ...] = (
                    (WAITER_PATH, WAITER_INSIDE),
                    (self._snippet, sandbox.SNIPPET_PATH),
                )
                snippet_fd = None
            else:
                code_fd = os.memfd_create("holdfast-snippet", os.MFD_CLOEXEC)
                fds.append(code_fd)
                os.write(code_fd, self.code.encode("utf-8", errors="surrogatepass"))
                os.lseek(code_fd, 0, os.SEEK_SET)
                inner = [self.isolation.python, "-I", sandbox.SNIPPET_PATH]
                ro_binds = ()
                snippet_fd = code_fd
            seccomp_fd = None
            if self.isolation.sandboxed:
                seccomp_fd = seccomp_policy.program_fd(self.isolation.seccomp)
                fds.append(seccomp_fd)
            joins = self._create_cgroups()
            command, args_fd = sandbox.hide_arguments(
                self.isolation.command(
                    uid=self.uid,
                    code_fd=snippet_fd,
                    seccomp_fd=seccomp_fd,
                    command=inner,
                    env=sandbox.EXECUTION_ENV,
                    ro_binds=ro_binds,
                )
            )
            if args_fd is not None:
                fds.append(args_fd)
            spec = {"cgroups": joins, "rlimits": self._rlimits(), "argv": command, "die_with_parent": os.getpid()}
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", WRAPPER_PATH, json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},  # the sandbox tooling itself sees no secrets either
                cwd="/",
                start_new_session=True,  # own session and process group: killpg reaches all
                close_fds=True,
                pass_fds=tuple(fds),
            )
            if self.code is None and self.cgroup:
                # Prepared ahead: at low priority until its execution arrives. Set here,
                # before anyone can take it (``deliver`` restores it, maybe at once), and
                # long before bubblewrap forks the sandbox, which inherits it.
                with contextlib.suppress(OSError):  # a priority is fairness, not containment
                    os.setpriority(os.PRIO_PROCESS, self.proc.pid, defaults.DEFAULT_RESERVE_NICE)
        except OSError as exc:
            self._close_status()
            self.cleanup()
            raise ChildError(f"could not start the child: {exc.__class__.__name__}") from None
        finally:
            for fd in fds:  # the child has its own copies now
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _new_snippet(self) -> str:
        """/holdfast/main.py exists as in a fresh sandbox (a snippet may run itself again,
        as multiprocessing's spawn does): an empty file now, its code at ``deliver``."""
        owner = self.uid if self.uid is not None else self.slot
        path = os.path.join(snippet_dir(), f"exec-{owner}.py")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "w"):
            pass
        os.chmod(path, 0o644)
        return path

    def _start_from_template(self, template: Template) -> None:
        """A child forked by the warm template: always started as a prepared one (its
        code comes down a pipe), and given its code at once if it has it already."""
        code, self.code = self.code, None
        theirs: list[int] = []
        ours: list[int] = []
        try:
            code_fd, self._feed = os.pipe()
            theirs.append(code_fd)
            self._status, status_fd = os.pipe()
            theirs.append(status_fd)
            for _ in range(3):  # stdout, stderr, exit
                read, write = os.pipe()
                ours.append(read)
                theirs.append(write)
            self._snippet = self._new_snippet()
            joins = self._create_cgroups()
            request = {
                "uid": self.uid,
                "cgroups": joins,
                # By number: the template runs here, imports nothing of ours, and so
                # keeps no second table of the names (exec_wrapper.RLIMITS).
                "rlimits": [[RLIMITS[name], value] for name, value in self._rlimits().items()],
                # Prepared ahead: at low priority until its execution arrives (as below).
                "nice": defaults.DEFAULT_RESERVE_NICE if code is None and self.cgroup else 0,
                "snippet": self._snippet,
            }
            pid, pidfd = template.spawn(request, theirs)
            self.proc = TemplateProcess(pid, pidfd, ours[2], ours[0], ours[1])
            ours = []
        except OSError as exc:
            for fd in ours:
                os.close(fd)
            feed, self._feed = self._feed, None
            if feed is not None:
                os.close(feed)  # a child forked after all reads EOF and exits unused
            self._close_status()
            self.cleanup()
            raise ChildError(f"could not start the child: {exc.__class__.__name__}: {exc}") from None
        finally:
            for fd in theirs:  # the template's children have their own copies now
                with contextlib.suppress(OSError):
                    os.close(fd)
        if code is not None:
            try:
                self.deliver(code, self.limits)
            except ChildError:
                self.kill()
                self.cleanup()
                raise

    def _create_cgroups(self) -> list[str]:
        """The execution's control groups, made now; what its first process joins."""
        if not self.cgroup:
            return []
        return self.isolation.cgroups.create(
            self.cgroup,
            memory_bytes=self.group_memory_mb * 1024 * 1024,
            max_processes=self.limits.max_processes,
            cpus=defaults.DEFAULT_EXECUTION_CPUS,
        )

    def deliver(self, code: str, limits: Limits) -> None:
        """Hand a prepared child its one execution. Raises ``ChildError`` if it is gone
        (it read nothing, so the code provably never ran)."""
        assert self._feed is not None
        source = code.encode("utf-8", errors="surrogatepass")
        payload = waiter.header(limits.memory_mb * 1024 * 1024, self._cpu_s(limits), len(source)) + source
        feed, self._feed = self._feed, None
        try:
            if self.cgroup:
                if limits.memory_mb != self.group_memory_mb:
                    self.isolation.cgroups.set_memory(self.cgroup, limits.memory_mb * 1024 * 1024)
                    self.group_memory_mb = limits.memory_mb
                # Out of the reserve's low priority, never a pid that may have been
                # reaped and handed to someone else: a template's child (the one
                # process of its sandbox until its code runs) checked alive by its
                # pidfd; else our own child (unreaped, so its pid is still its own),
                # which may not have joined its groups yet, and the processes there.
                if isinstance(self.proc, TemplateProcess):
                    self.proc.set_priority(0)
                else:
                    pids = set(self.isolation.cgroups.members(self.cgroup, one_list=True))
                    if self.proc is not None and self.proc.poll() is None:
                        pids.add(self.proc.pid)
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.setpriority(os.PRIO_PROCESS, pid, 0)
            # The file first: the code must be there before it runs. Plain writes, no
            # file objects: this is on every execution's path, and there each object
            # built costs (docs/benchmarks.md, eleventh session).
            _write_all(os.open(self._snippet, os.O_WRONLY | os.O_TRUNC), source)
            # Our end stays open: a sandbox killed as it was taken has not released its
            # end yet, so the write succeeds; what it left unread says so (``wait``).
            _write_whole(feed, payload)
        except BaseException as exc:
            os.close(feed)
            if isinstance(exc, OSError):
                raise ChildError(f"the prepared child is gone: {exc.__class__.__name__}") from None
            raise
        self._fed, self._fed_bytes = feed, len(payload)
        self.code, self.limits = code, limits

    def discard(self) -> None:
        """Let an unused prepared child go: it reads an empty pipe and exits unused."""
        feed, self._feed = self._feed, None
        if feed is not None:
            os.close(feed)
        self.kill()

    def _rlimits(self) -> dict[str, int]:
        limits = self.limits
        return {
            "cpu_s": self._cpu_s(limits),
            "as_bytes": limits.memory_mb * 1024 * 1024,
            "nproc": limits.max_processes,
            "fsize": limits.max_file_bytes,
            "nofile": limits.max_open_files,
            "core": 0,
        }

    @staticmethod
    def _cpu_s(limits: Limits) -> int:
        return -(-limits.timeout_ms // 1000) + defaults.DEFAULT_CPU_MARGIN_S

    def stop(self, status: str, error: str = "") -> None:
        """Ask ``wait`` to kill the child and report ``status`` (cancel, drain expiry)."""
        if not self._stop.is_set():
            self._stop_status, self._stop_error = status, error
            self._stop.set()

    def wait(self) -> ChildOutcome:
        assert self.proc is not None and self.proc.stdout and self.proc.stderr
        started = time.monotonic()
        deadline = started + self.limits.timeout_ms / 1000
        out, err = _Capped(self.limits.max_output_bytes), _Capped(self.limits.max_output_bytes)
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ, out)
        sel.register(self.proc.stderr, selectors.EVENT_READ, err)
        if self._status is not None:
            sel.register(self._status, selectors.EVENT_READ, None)
        status = error = ""
        exited_at: float | None = None
        pipes_held = False
        early_code: int | None = None
        try:
            while sel.get_map() and early_code is None:
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
                    pipes_held = True
                    break  # something outside the group holds the pipes; stop waiting on it
                wake = min(defaults.DEFAULT_POLL_INTERVAL_S, max(0.0, deadline - now))
                for key, _ in sel.select(timeout=wake):
                    chunk = os.read(key.fd, 65536)
                    if key.data is None:  # the waiter's exit status
                        sel.unregister(key.fileobj)
                        early_code = None if status else _exit_status(chunk)
                        if early_code is not None:
                            # Flushed before the status was written: all of it is in the pipes.
                            _drain(self.proc.stdout, out)
                            _drain(self.proc.stderr, err)
                            break
                    elif chunk:
                        key.data.add(chunk)
                    else:
                        sel.unregister(key.fileobj)
            if early_code is not None:
                returncode, self._ended_early = early_code, True  # cleanup() kills what is left
            else:
                returncode = self.proc.wait()
        finally:
            sel.close()
            self._close_status()
            self.proc.stdout.close()
            self.proc.stderr.close()
            if status:  # we killed it: make sure nothing of it is left
                self.kill()
            elif not self.isolation.sandboxed and self.uid is not None:
                # Without a PID namespace a background process outlives the child: sweep
                # the slot's uid. A sandbox's processes died with its namespace's init
                # (bubblewrap has exited), so this /proc scan stays off that path.
                kill_uid(self.uid)
        duration_ms = int((time.monotonic() - started) * 1000)
        self.died_unread = not status and not pipes_held and self._killed_unread(returncode)
        if status:
            return ChildOutcome(status, None, out.text(), err.text(), duration_ms, error)
        if returncode == 0:
            return ChildOutcome("succeeded", 0, out.text(), err.text(), duration_ms)
        if returncode < 0:  # killed by a signal (a CPU or memory rlimit): report it as a shell would
            name = _signal_name(-returncode)
            return ChildOutcome("failed", 128 - returncode, out.text(), err.text(), duration_ms, f"killed by {name}")
        return ChildOutcome("failed", returncode, out.text(), err.text(), duration_ms)

    def kill(self) -> None:
        """SIGKILL the child's process group. With a PID namespace this kills the
        namespace's init, and the kernel then kills every process left inside it."""
        if self.proc is None:
            return
        if isinstance(self.proc, TemplateProcess):
            self.proc.kill()
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.cgroup:
            self.isolation.cgroups.kill(self.cgroup)
        if not self.isolation.sandboxed and self.uid is not None:
            kill_uid(self.uid)  # without a PID namespace, a setsid'd grandchild left the group

    def _killed_unread(self, returncode: int) -> bool:
        """Whether this prepared child was killed before it read a byte of its code, so
        the caller may run the code elsewhere. Only a SIGKILL (bubblewrap reports its
        child's as 137) that its memory bound did not cause: a death that would repeat
        (a setup failure, a bound too small to start in) stays this execution's
        failure. Never without the full sandbox, where the code could reach the pipe."""
        if not self._fed_bytes or not self.isolation.sandboxed:
            return False
        if returncode not in (-signal.SIGKILL, 128 + signal.SIGKILL):
            return False
        if self.cgroup and self.isolation.cgroups.oom_kills(self.cgroup):
            return False
        return self._unread() == self._fed_bytes

    def _unread(self) -> int:
        """Bytes of the delivered payload still in the code pipe (0 if none was)."""
        if self._fed is None:
            return 0
        count = array.array("i", [0])
        try:
            fcntl.ioctl(self._fed, termios.FIONREAD, count)
        except OSError:
            return 0
        return count[0]

    def _close_status(self) -> None:
        status, self._status = self._status, None
        if status is not None:
            os.close(status)

    def cleanup(self) -> None:
        """Remove the execution's control groups, once. The groups are named after the
        slot's uid: once the slot is free they may belong to the next execution, so a
        second call must not touch them. A child reported at its exit status is still
        tearing its sandbox down: it is reaped first (killed if that takes long), so
        nothing of it outlives its slot."""
        if self._ended_early and self.proc is not None:
            self._ended_early = False
            try:
                # Its interpreter has exited, so bubblewrap is ending the sandbox already;
                # a kill now would only make the kernel's teardown slower.
                self.proc.wait(timeout=defaults.DEFAULT_PIPE_DRAIN_S)
            except subprocess.TimeoutExpired:
                self.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=defaults.DEFAULT_PIPE_DRAIN_S)
        self._close_status()
        # Our ends of its code pipe: after delivery, or never delivered (a start that
        # failed after making the pipe).
        fds, self._fed, self._feed = (self._fed, self._feed), None, None
        for fd in fds:
            if fd is not None:
                os.close(fd)
        if isinstance(self.proc, TemplateProcess):
            self.proc.close()
        cgroup, self.cgroup = self.cgroup, ""
        if cgroup:
            self.isolation.cgroups.remove(cgroup)
        snippet, self._snippet = self._snippet, ""
        if snippet:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(snippet)


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` whole to ``fd``, then close it (on an error too)."""
    try:
        _write_whole(fd, data)
    finally:
        os.close(fd)


def _write_whole(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _exit_status(reported: bytes) -> int | None:
    """An exit status the waiter reported, or None for anything an exit could not give:
    the code can write to that pipe too, and may then only claim what exiting could."""
    text = reported.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 3):
        return None
    code = int(text)
    return code if code <= 255 else None


def _drain(pipe, sink: _Capped) -> None:
    """Read what ``pipe`` holds now, without waiting for its writers to close it."""
    os.set_blocking(pipe.fileno(), False)
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(pipe.fileno(), 65536):
            sink.add(chunk)


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
