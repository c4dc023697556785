"""The host's side of the warm template (``template.py``): starts it, restarts it when it
dies, and asks it for one contained child per execution.

A child of the template is not a child of the host, so the host cannot ``waitpid`` it.
``TemplateProcess`` stands in for ``subprocess.Popen`` where ``Child`` uses it (``pid``
for the group kill, ``poll``, ``wait``, ``returncode``, ``stdout``, ``stderr``), backed by
the *exit pipe*: the template, its parent, writes the child's wait status there once it
reaped it, and a pipe that ends with nothing written means the template died (and the
child with it, by its parent-death signal).

The template is started and supervised by one thread that lives as long as the host:
its parent-death signal fires when the *thread* that forked it ends, not only the
process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING

from holdfast_wire import backoff

from . import defaults, sandbox, seccomp_policy
from .log import log

if TYPE_CHECKING:
    from .isolation import Isolation

TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template.py")
WAITER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "waiter.py")
WAITING_NAME = "holdfast-wait"  # a waiting template child's /proc/<pid>/comm


class TemplateUnavailable(OSError):
    """The template is gone (or never came up); nothing was started."""


class _NotSent(Exception):
    """A fork request that no template received."""


# A send that failed for one of these found the template dead or stuck.
_GONE_OR_STUCK = (BrokenPipeError, ConnectionResetError, TimeoutError)


class TemplateProcess:
    """A template child as ``Child`` sees it (the subset of ``Popen`` it uses)."""

    def __init__(self, pid: int, pidfd: int, exit_fd: int, stdout_fd: int, stderr_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._exit_fd = exit_fd
        self._lock = threading.Lock()
        self.stdout = open(stdout_fd, "rb", buffering=0)  # closed by Child.wait
        self.stderr = open(stderr_fd, "rb", buffering=0)  # closed by Child.wait

    def _collect(self, timeout: float | None) -> bool:
        with self._lock:
            if self.returncode is not None:
                return True
            if self._exit_fd < 0:
                raise ValueError("wait on a closed template child")
            if not select.select([self._exit_fd], [], [], timeout)[0]:
                return False
            data = os.read(self._exit_fd, 64)
            if not data.strip().isdigit():
                # Nothing written: the template died before it could report. The child
                # dies with it by its parent-death signal; killed here too, by its pidfd
                # (exactly it), so its end never rests on the child's own state alone.
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            status = int(data) if data.strip().isdigit() else signal.SIGKILL
            self.returncode = os.waitstatus_to_exitcode(status)
            self._close_fds()
            return True

    def _close_fds(self) -> None:
        for fd in (self._exit_fd, self._pidfd):
            if fd >= 0:
                os.close(fd)
        self._exit_fd = self._pidfd = -1

    def close(self) -> None:
        """Let go of every descriptor (after its end, or to abandon it once killed)."""
        with self._lock:
            self._close_fds()
        self.stdout.close()
        self.stderr.close()

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._collect(timeout):
            raise subprocess.TimeoutExpired("template child", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def set_priority(self, value: int) -> None:
        """``setpriority`` on this child, not on a reused pid: only while its pidfd
        says it lives (a zombie too). Its parent, the template, may reap it between
        the check and the call; its pid could then be someone else's only once the
        kernel has handed out every other pid, far longer than these two calls. (A
        read of its group's members had the same window.)"""
        with self._lock:
            if self.returncode is not None or self._pidfd < 0:
                return
            try:
                signal.pidfd_send_signal(self._pidfd, 0)
                os.setpriority(os.PRIO_PROCESS, self.pid, value)
            except ProcessLookupError:
                return  # ended: its pid may belong to someone else by now

    def kill(self) -> None:
        """SIGKILL the child by its pidfd: exactly it, never a reused pid. It is its PID
        namespace's init: once it dies, so does everything in the namespace, so no
        process group is signalled (by pid, which may be someone else's once reaped)."""
        with self._lock:
            if self.returncode is not None or self._pidfd < 0:
                return  # ended: its pid may belong to someone else by now
            with contextlib.suppress(ProcessLookupError):  # ended and reaped already
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)


class Template:
    """One template process per host, restarted when it dies."""

    def __init__(self, isolation: Isolation) -> None:
        assert isolation.layout is not None and isolation.uid_base is not None
        self.isolation = isolation
        self._cond = threading.Condition()
        self._request_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # The sandboxes' filter (isolation.build compiled it already, so this cannot fail
        # where that did not) with the rule only a template child needs.
        self._seccomp = seccomp_policy.compile_filter(template=True)
        self._thread = threading.Thread(target=self._supervise, name="template", daemon=True)

    def start(self, timeout: float = defaults.DEFAULT_TEMPLATE_START_TIMEOUT_S) -> None:
        """Start the supervisor and wait for the first template. Raises
        ``TemplateUnavailable`` if it does not come up."""
        self._thread.start()
        with self._cond:
            if not self._cond.wait_for(lambda: self._sock is not None, timeout=timeout):
                raise TemplateUnavailable("the warm template did not start")

    @property
    def pid(self) -> int | None:
        with self._cond:
            return self.proc.pid if self.proc is not None and self._sock is not None else None

    def _config(self) -> dict[str, object]:
        from .children import snippet_dir

        lay = self.isolation.layout
        assert lay is not None
        inside = [*lay.binds, *(link for _, link in lay.symlinks), "/var/tmp", sandbox.SNIPPET_PATH]  # noqa: S108 - inside
        inside += [self.isolation.shared_dir] if self.isolation.shared_dir else []
        with open(WAITER_PATH) as fh:
            waiter = fh.read()
        return {
            "host_pid": os.getpid(),
            "waiter": waiter,
            "seccomp": self._seccomp.hex(),
            "newroot": os.path.join(snippet_dir(), "root"),
            "parents": sandbox._parents(inside),
            "binds": list(lay.binds),
            "symlinks": [list(pair) for pair in lay.symlinks],
            "masks": list(lay.masks),
            "devices": list(sandbox.DEVICES),
            "scratch": sandbox.SCRATCH,
            "scratch_bytes": self.isolation.scratch_bytes,
            "snippet_path": sandbox.SNIPPET_PATH,
            "shared_dir": self.isolation.shared_dir,
            "env": sandbox.EXECUTION_ENV,
            "comm": os.path.basename(self.isolation.python),
            "waiting_name": WAITING_NAME,
        }

    def _launch(self) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(TEMPLATE_PATH, "rb") as fh:
                source = fh.read()
            proc = subprocess.Popen(
                [self.isolation.python, "-I", "-S", "-", "holdfast-template", str(theirs.fileno())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                env={},  # never the host's token, nor anything else of its environment
                cwd="/",
                start_new_session=True,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        try:
            assert proc.stdin is not None
            proc.stdin.write(source)
            proc.stdin.close()
            ours.settimeout(defaults.DEFAULT_TEMPLATE_START_TIMEOUT_S)
            ours.send(json.dumps(self._config()).encode())
            reply = json.loads(ours.recv(4096) or b"{}")
            if reply.get("ready") != proc.pid:
                raise TemplateUnavailable(f"the template answered {reply!r}")
            ours.settimeout(defaults.DEFAULT_TEMPLATE_REPLY_TIMEOUT_S)
        except (OSError, ValueError):
            proc.kill()
            proc.wait()
            ours.close()
            raise
        return proc, ours

    def _supervise(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                proc, sock = self._launch()
            except (OSError, ValueError) as exc:
                log("template_start_failed", error=f"{exc.__class__.__name__}: {exc}")
                backoff.wait(
                    failures, first_s=defaults.DEFAULT_TEMPLATE_RETRY_S, max_s=defaults.DEFAULT_TEMPLATE_RETRY_MAX_S
                )
                failures += 1
                continue
            with self._cond:
                self.proc, self._sock = proc, sock
                self.starts += 1
                self._cond.notify_all()
            log("template_started", pid=proc.pid, starts=self.starts)
            returncode = proc.wait()
            with self._cond:
                if self._sock is sock:
                    self._sock = None
            with self._request_lock:
                sock.close()
            log("template_exited", level="warning", pid=proc.pid, returncode=returncode)
            # A template that dies at once is broken, not unlucky: do not spin on it.
            failures = failures + 1 if time.monotonic() - started < defaults.DEFAULT_TEMPLATE_RETRY_MAX_S else 0
            if failures:
                backoff.wait(
                    failures - 1,
                    first_s=defaults.DEFAULT_TEMPLATE_RETRY_S,
                    max_s=defaults.DEFAULT_TEMPLATE_RETRY_MAX_S,
                )

    def spawn(self, request: dict[str, object], fds: list[int]) -> tuple[int, int]:
        """Fork one contained child: its pid and a pidfd of it. Raises
        ``TemplateUnavailable`` if the template is gone or refuses (nothing started).

        A request that could not be sent to the template (it died a moment ago, its
        supervisor not yet told) waits once more for the restarted one: no template got
        it, so asking the successor starts nothing twice. The code goes down the
        child's own pipe only after this returns, so no attempt here ever ran any."""
        try:
            return self._ask(self._running_sock(), request, fds)
        except _NotSent:
            pass
        try:
            return self._ask(self._running_sock(), request, fds)
        except _NotSent as exc:
            raise TemplateUnavailable(f"the warm template is gone: {exc}") from None

    def _running_sock(self) -> socket.socket:
        with self._cond:
            # A template being restarted is back within milliseconds: wait for it briefly
            # rather than fail an execution that could run.
            self._cond.wait_for(lambda: self._sock is not None, timeout=defaults.DEFAULT_TEMPLATE_WAIT_S)
            sock = self._sock
        if sock is None:
            raise TemplateUnavailable("the warm template is not running")
        return sock

    def _ask(self, sock: socket.socket, request: dict[str, object], fds: list[int]) -> tuple[int, int]:
        with self._request_lock:
            with self._cond:
                replaced = self._sock is not sock
            if replaced:
                # Died, or killed for a request that timed out while we waited for the
                # lock (its late reply may still be in this socket, and would be taken
                # for ours): nothing of ours was sent on it.
                raise _NotSent("replaced")
            try:
                socket.send_fds(sock, [json.dumps(request).encode()], fds)
            except OSError as exc:
                # A message is queued whole or not at all: no template has it. Asked
                # again only where its successor may take it (a dead peer, one too
                # stuck to take it); an error that would repeat fails as before.
                self._restart(sock)
                if isinstance(exc, _GONE_OR_STUCK) or exc.errno == errno.ENOTCONN:
                    raise _NotSent(exc.__class__.__name__) from None
                raise TemplateUnavailable(f"the warm template is gone: {exc.__class__.__name__}") from None
            try:
                message, got, _, _ = socket.recv_fds(sock, 4096, 1)
            except OSError as exc:
                # It had the request and may have forked: never asked again.
                self._restart(sock)
                raise TemplateUnavailable(f"the warm template is gone: {exc.__class__.__name__}") from None
        if not message:
            raise TemplateUnavailable("the warm template is gone")
        try:
            reply = json.loads(message)
            pid = int(reply["pid"]) if "pid" in reply and len(got) == 1 else None
        except (ValueError, TypeError, KeyError):
            reply, pid = None, None
        if pid is None:
            for fd in got:
                os.close(fd)
            if not isinstance(reply, dict):
                # Not its protocol: out of step, as after a failed request.
                self._restart(sock)
                raise TemplateUnavailable("the warm template answered something unreadable")
            raise TemplateUnavailable(f"the warm template refused: {reply.get('error', reply)}")
        os.set_inheritable(got[0], False)  # SCM_RIGHTS gives it without close-on-exec
        return pid, got[0]

    def _restart(self, sock: socket.socket) -> None:
        """A request that timed out or failed midway leaves the protocol out of step:
        kill the template; the supervisor starts a new one."""
        with self._cond:
            proc = self.proc if self._sock is sock else None
            if proc is not None:
                self._sock = None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
