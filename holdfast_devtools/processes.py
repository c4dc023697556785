"""Start sandbox hosts, Celery workers and other children as processes on this machine.

Used by the demos (``manage.py demo``, ``demo_deploy``), ``bench/`` and the tests, where
one command must bring up the whole path. Production runs them from the Procfile.

One readiness rule: a child is ready when its readiness line appears in its output.
A host's is the line it prints on stdout once its socket listens (``HOST_LISTENING``),
which names its address, id and containment level; a worker's is Celery's ``ready.``.
Output is collected by threads, so a child never blocks on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Printed by ``python -m sandbox_host`` once it listens (``sandbox_host/__main__.py``).
HOST_LISTENING = re.compile(r"^holdfast-host listening (wss?://(\S+):(\d+)) host_id=(\S+) isolation=(\S+)$")
# Celery's "celery@host ready." as a logfmt event (quoted: it holds a space).
WORKER_READY = re.compile(r"\bready\.\"?$")

# Timeouts
# A host prints its address within a second or two; the worker imports Django and
# Celery and connects to the broker, which on a cold, busy machine takes longer.
HOST_START_TIMEOUT_S = 30.0
WORKER_START_TIMEOUT_S = 90.0
# A host drains before it exits on SIGTERM (its grace period); then it is killed.
STOP_TIMEOUT_S = 60.0


class Child:
    """A child process, ready once ``ready`` matches a line of its output (stdout and
    stderr both, merged unless ``split_stderr``)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        ready: re.Pattern[str],
        *,
        split_stderr: bool = False,
        cwd: str | Path | None = None,
    ) -> None:
        """``cwd``: where it starts (this checkout by default); ``python -m`` puts it
        first on ``sys.path``, ahead of ``PYTHONPATH``, so it decides whose code runs."""
        self.name = name
        self.lines: list[str] = []  # every line, both streams, in arrival order
        self.stdout_lines: list[str] = []
        self.log_lines: list[str] = []  # stderr, when split
        self.match: re.Match[str] | None = None
        self._ready = threading.Event()
        self._pattern = ready
        stderr = subprocess.PIPE if split_stderr else subprocess.STDOUT
        self.popen = subprocess.Popen(argv, cwd=cwd or ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.pid = self.popen.pid
        self._readers = [threading.Thread(target=self._read, args=(self.popen.stdout, self.stdout_lines), daemon=True)]
        if split_stderr:
            self._readers.append(
                threading.Thread(target=self._read, args=(self.popen.stderr, self.log_lines), daemon=True)
            )
        for reader in self._readers:
            reader.start()

    def _read(self, pipe, into: list[str]) -> None:
        for line in pipe:
            line = line.rstrip("\n")
            into.append(line)
            self.lines.append(line)
            if not self._ready.is_set():
                found = self._pattern.search(line)
                if found:
                    self.match = found
                    self._ready.set()
        self._ready.set()  # exited before it was ready: let the waiter see it

    def wait_ready(self, timeout: float) -> re.Match[str]:
        if not self._ready.wait(timeout) or self.match is None:
            self.kill()
            tail = "\n".join(self.lines[-20:])
            raise RuntimeError(f"{self.name} did not start:\n{tail}")
        return self.match

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the child and whatever children it had (they would outlive it)."""
        stragglers = descendants(self.pid)
        if self.popen.poll() is None:
            self.popen.kill()
        for pid in stragglers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Signal, wait up to ``timeout``, then kill; join the readers. The exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                self.popen.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()
        return self.popen.returncode


class HostProcess(Child):
    """A running ``python -m sandbox_host``: its stdout says where it listens, its
    stderr is the structured log (``log()``)."""

    @property
    def url(self) -> str:
        return self.match.group(1) if self.match else ""

    @property
    def port(self) -> int:
        return int(self.match.group(3)) if self.match else 0

    @property
    def host_id(self) -> str:
        return self.match.group(4) if self.match else ""

    @property
    def isolation(self) -> str:
        return self.match.group(5) if self.match else ""

    def log(self) -> str:
        return "\n".join(self.log_lines)


def start_host(
    token: str,
    *,
    host_id: str | None = None,
    listen: str = "127.0.0.1:0",
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] | list[str] = (),
    timeout_s: float = HOST_START_TIMEOUT_S,
    checkout: str | Path | None = None,
) -> HostProcess:
    """A host listening on ``listen`` (port 0: any free port), ready; the caller stops it.
    ``checkout``: another tree whose host to run (a bench comparing two revisions)."""
    argv = [sys.executable, "-m", "sandbox_host", "--listen", listen]
    if host_id:
        argv += ["--host-id", host_id]
    argv += list(extra_args)
    child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    child_env["HOLDFAST_SANDBOX_TOKEN"] = token
    if env and "HOLDFAST_SANDBOX_TOKEN" in env:  # a test of the empty-token refusal
        child_env["HOLDFAST_SANDBOX_TOKEN"] = env["HOLDFAST_SANDBOX_TOKEN"]
    host = HostProcess(
        f"host {host_id or ''}".strip(), argv, child_env, HOST_LISTENING, split_stderr=True, cwd=checkout
    )
    if not host._ready.wait(timeout_s) or host.match is None:
        host.kill()
        host.stop(timeout=5)
        raise RuntimeError("sandbox host did not start:\n" + "\n".join(host.lines[-40:]))
    return host


@contextlib.contextmanager
def running_host(token: str, *, stop_timeout_s: float = STOP_TIMEOUT_S, **options) -> Iterator[HostProcess]:
    """``start_host`` for the length of a block, then stop it and join."""
    host = start_host(token, **options)
    try:
        yield host
    finally:
        host.stop(timeout=stop_timeout_s)


def host_url(host: HostProcess) -> str:
    return host.url


def host_port(host: HostProcess) -> int:
    return host.port


def start_worker(
    env: dict[str, str], *, concurrency: int = 4, name: str = "worker", extra_args: tuple[str, ...] = ()
) -> Child:
    child_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    queue = child_env.get("HOLDFAST_CELERY_QUEUE", "holdfast")
    argv = [
        sys.executable, "-m", "celery", "-A", "controlplane", "worker",
        "--pool", "threads", "--concurrency", str(concurrency), "-Q", queue,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel", "INFO", "--hostname", f"{name}-{os.getpid()}-{time.monotonic_ns()}@%h",
        *extra_args,
    ]  # fmt: skip
    worker = Child(name, argv, child_env, WORKER_READY)
    worker.wait_ready(WORKER_START_TIMEOUT_S)
    return worker


def busy_descendants(pid: int) -> list[int]:
    """``descendants`` less the sandboxes a host keeps prepared, waiting for code: a
    bubblewrap sandbox's waiter, and with the warm template (its process, idle between
    forks, is not busy either) a child named so while it waits."""
    from sandbox_host.children import WAITER_INSIDE
    from sandbox_host.template_host import WAITING_NAME

    found = descendants(pid)

    def read(child: int) -> tuple[list[bytes], str, int]:
        with open(f"/proc/{child}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        with open(f"/proc/{child}/stat") as fh:
            stat = fh.read()
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        return argv, comm, int(stat.rsplit(")", 1)[1].split()[1])

    info = {}
    for child in found:
        with contextlib.suppress(OSError, ValueError):
            info[child] = read(child)
    waiting = {child for child, (_, comm, _) in info.items() if comm == WAITING_NAME}
    busy = []
    for child, (argv, _, ppid) in info.items():
        if WAITER_INSIDE.encode() in argv or child in waiting:
            continue
        if b"holdfast-template" in argv and ppid == pid:
            continue  # the template itself
        busy.append(child)
    return busy


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc), deepest last."""
    if pid <= 1:
        return []  # never walk (let alone kill) the tree of init
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may hold spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found
