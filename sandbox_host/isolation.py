"""The containment level of this host, built and proven once at start-up.

DESIGN.md (Containment): "A host that cannot build this refuses to start unless an
operator asks for less with an explicitly unsafe flag; its level is sent in auth_ok".

Levels, strongest first (``LEVELS`` is weakest first, for comparisons):

* ``bwrap``: the full containment of ``sandbox.py`` on a root host: bubblewrap, a
  private read-only root, one capped tmpfs, its own PID/mount/network/IPC/UTS/cgroup
  namespaces, the slot's own unprivileged uid, no capabilities, no_new_privs, the
  seccomp filter, and per-sandbox control groups where the machine offers them. The
  only level ``auto`` picks; a host that cannot build it exits 2 with one line saying
  what is missing.
* ``insecure-shared-uid``: the same sandbox on a host that is not root. Without root
  there is no other uid to give user code: it runs in a user namespace mapped to the
  host's own uid, so a kernel escape would own the host user's files. Only by explicit
  request.
* ``insecure-shared-dir``: the full sandbox, except that one host directory is bound
  read-write into every sandbox (``--insecure-shared-dir``, for test harnesses that
  count what ran): every tenant can read and write what the others leave there.
* ``insecure-rlimits``: no sandbox at all, only rlimits, an empty environment and (as
  root) the slot's uid. User code shares the host's network and filesystem. For a
  developer machine without bubblewrap, only by explicit request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from holdfast_wire import protocol

from . import cgroups as cgroups_mod
from . import defaults, sandbox, seccomp_policy, uids
from .children import Child, ChildError, Limits, snippet_dir

if TYPE_CHECKING:
    from .template_host import Template

RLIMITS, SHARED_UID, SHARED_DIR, FULL = protocol.ISOLATION_LEVELS  # weakest first
LEVELS = protocol.ISOLATION_LEVELS
# What each explicit, weaker level gives up, said at start-up and in every auth_ok.
WARNINGS = {
    SHARED_UID: "user code runs under the host's own uid in a user namespace: an escape owns the host user's files",
    SHARED_DIR: "every sandbox can read and write one shared host directory (for test harnesses only)",
    RLIMITS: "user code is NOT sandboxed: it shares the host's network, filesystem and kernel surface",
}


@dataclass(frozen=True)
class Isolation:
    name: str
    # First uid of this host's execution slots (root hosts), or None.
    uid_base: int | None
    layout: sandbox.Layout | None = None
    seccomp: bytes = b""
    cgroups: cgroups_mod.Cgroups = field(default_factory=lambda: cgroups_mod.Cgroups("", {}))
    # Writable space of one execution (its one tmpfs), bytes.
    scratch_bytes: int = defaults.DEFAULT_SCRATCH_BYTES
    # Interpreter user code runs in.
    python: str = sys.executable
    # --insecure-shared-dir: one host directory every sandbox may write (test harnesses).
    shared_dir: str = ""
    # The warm template children come from (--template on), or None: each sandbox is
    # then a fresh bubblewrap sandbox and interpreter. Not part of the level: both build
    # the same containment, and the start-up probe proves the one in use.
    template: Template | None = field(default=None, compare=False)

    @property
    def sandboxed(self) -> bool:
        return self.layout is not None

    @property
    def no_network(self) -> bool:
        return self.sandboxed

    def uid_for(self, slot: int) -> int | None:
        return None if self.uid_base is None else self.uid_base + slot

    def bounds(self) -> dict[str, object]:
        """The bounds in force for one sandbox as a whole, for the log and ``auth_ok``."""
        found: dict[str, object] = {
            **self.cgroups.bounds(),
            "cpu": "rlimit",
            "time": "wall clock, whole sandbox",
            "scratch_bytes": self.scratch_bytes if self.sandboxed else None,
            "seccomp": bool(self.seccomp),
        }
        if self.name in WARNINGS:
            found["warning"] = WARNINGS[self.name]
        if self.shared_dir:
            found["insecure_shared_dir"] = self.shared_dir
        return found

    def command(
        self,
        *,
        uid: int | None,
        code_fd: int | None,
        seccomp_fd: int | None,
        command: list[str],
        scratch_bytes: int | None = None,
        env: dict[str, str] | None = None,
        die_with_parent: bool = True,
        ro_binds: tuple[tuple[str, str], ...] = (),
        status_fd: int | None = None,
    ) -> list[str]:
        """The command that starts one sandbox around ``command`` (which may name
        ``sandbox.SNIPPET_PATH``: the snippet from ``code_fd``)."""
        if self.layout is None:  # insecure-rlimits: the snippet is read from its descriptor
            command = [f"/proc/self/fd/{code_fd}" if part == sandbox.SNIPPET_PATH else part for part in command]
            if uid is None:
                return command
            return [
                sandbox.setpriv_path(),
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--no-new-privs",
                "--",
                *command,
            ]
        assert seccomp_fd is not None
        spec = sandbox.Spec(
            uid=uid,
            scratch_bytes=scratch_bytes or self.scratch_bytes,
            seccomp_fd=seccomp_fd,
            command=tuple(command),
            env=tuple((env or {}).items()),
            die_with_parent=die_with_parent,
            data_files=((code_fd, sandbox.SNIPPET_PATH),) if code_fd is not None else (),
            ro_binds=ro_binds,
            status_fd=status_fd,
            shared_dir=self.shared_dir,
        )
        return sandbox.argv(self.layout, spec)


def build(level: str, *, uid_base: int | None, scratch_bytes: int = defaults.DEFAULT_SCRATCH_BYTES) -> Isolation:
    """The isolation of ``level`` on this machine, not yet proven. Raises RuntimeError
    with one line naming what is missing."""
    is_root = os.geteuid() == 0
    groups, _ = cgroups_mod.detect()
    if level == RLIMITS:
        # No private root: the slot's uid must reach the interpreter on the host's disk.
        python = child_python() if is_root else sandbox.base_interpreter()[0]
        return Isolation(RLIMITS, uid_base, cgroups=groups, python=python)
    if level == FULL and not is_root:
        raise RuntimeError(
            "the host is not root, so user code cannot get a uid of its own; run the host as root, "
            f"or pass --isolation {SHARED_UID} to accept running it under the host's uid"
        )
    if level == SHARED_UID and is_root:
        raise RuntimeError(f"{SHARED_UID} is for hosts that are not root; a root host uses --isolation {FULL}")
    if level not in (FULL, SHARED_UID):
        raise RuntimeError(f"unknown isolation {level!r}; expected auto, {', '.join(reversed(LEVELS))}")
    try:
        lay = sandbox.layout()
        program = seccomp_policy.compile_filter()
    except (sandbox.SandboxUnavailable, seccomp_policy.SeccompUnavailable) as exc:
        raise RuntimeError(f"cannot build the sandbox: {exc}") from None
    return Isolation(
        level,
        uid_base if is_root else None,
        layout=lay,
        seccomp=program,
        cgroups=groups,
        scratch_bytes=scratch_bytes,
        python=lay.python,
    )


def child_python() -> str:
    """The first interpreter every user may execute: ours if it is reachable, else the
    system's (insecure-rlimits only: a sandbox binds ours at its own path)."""
    for path in (sandbox.base_interpreter()[0], *defaults.DEFAULT_FALLBACK_PYTHONS):
        if _world_executable(path):
            return path
    return sandbox.base_interpreter()[0]  # the probe will then fail and say why


def _world_executable(path: str) -> bool:
    real = os.path.realpath(path)
    try:
        if not os.stat(real).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(real)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


# The probe snippet prints what the sandbox must show: its uid, an empty environment,
# no_new_privs, a loaded filter, an empty bounding set, no network interface but lo.
_PROBE = """
import os, socket
status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\\t' in line)
ifaces = sorted(name for _, name in socket.if_nameindex())
print('ok', os.getuid(), ','.join(sorted(os.environ)) or '-', status.get('NoNewPrivs', '?').strip(),
      status.get('Seccomp', '?').strip(), status.get('CapBnd', '?').strip(), ','.join(ifaces) or '-')
"""


def works(isolation: Isolation) -> tuple[bool, str]:
    """Run one trivial child through ``isolation`` exactly as an execution would, and
    check that what it sees is what the level promises."""
    child = Child(
        _PROBE,
        Limits(timeout_ms=int(defaults.DEFAULT_PROBE_TIMEOUT_S * 1000), memory_mb=512),
        isolation=isolation,
        uid=isolation.uid_for(0),
    )
    try:
        child.start()
    except ChildError as exc:
        return False, str(exc)
    try:
        outcome = child.wait()
    finally:
        child.cleanup()
    words = outcome.stdout.split()
    if outcome.status != "succeeded" or len(words) != 7 or words[0] != "ok":
        return False, f"status={outcome.status} stderr={outcome.stderr.strip()[-300:]}"
    _, uid, env, nnp, seccomp, capbnd, ifaces = words
    expected_uid = isolation.uid_for(0)
    if expected_uid is None and isolation.sandboxed:
        expected_uid = sandbox.USERNS_UID
    if expected_uid is not None and uid != str(expected_uid):
        return False, f"child ran as uid {uid}, expected {expected_uid}"
    # The sandbox's own variables, PWD (bubblewrap sets it) and LC_CTYPE (Python's PEP 538
    # locale coercion may add it); anything else leaked in.
    if set(env.split(",")) - {"-", "LC_CTYPE", "PWD", *sandbox.EXECUTION_ENV}:
        return False, f"child saw a non-empty environment ({env})"
    if isolation.sandboxed:
        failures = []
        if nnp != "1":
            failures.append("no_new_privs is not set")
        if seccomp != "2":
            failures.append("no seccomp filter is loaded")
        if int(capbnd, 16) != 0 and isolation.uid_base is not None:
            failures.append("the capability bounding set is not empty")
        if ifaces not in ("lo", "-"):
            failures.append(f"the sandbox sees network interfaces {ifaces}")
        if failures:
            return False, "; ".join(failures)
    return True, ""


def probe(
    log: Callable[..., None],
    *,
    uid_base: int | None,
    require: str | None = None,
    scratch_bytes: int | None = None,
    shared_dir: str = "",
) -> Isolation:
    """Build and prove ``require`` (``None``/"auto": the full containment, nothing
    less). Raises ``RuntimeError`` with one line when it cannot."""
    level = FULL if require in (None, "auto") else require
    isolation = build(level, uid_base=uid_base, scratch_bytes=scratch_bytes or defaults.DEFAULT_SCRATCH_BYTES)
    if shared_dir:
        if not isolation.sandboxed:
            raise RuntimeError("--insecure-shared-dir needs a sandbox to bind it into")
        # Reported as a level of its own, below the full one: a pool that requires the
        # full sandbox must not send work to a host whose tenants share a directory.
        name = SHARED_DIR if level == FULL else level
        isolation = dataclasses.replace(isolation, name=name, shared_dir=os.path.realpath(shared_dir))
    ok, why = works(isolation)
    if not ok:
        log("isolation_unavailable", isolation=level, reason=why)
        raise RuntimeError(f"isolation {level!r} does not work on this machine: {why}")
    _, cgroup_reason = cgroups_mod.detect() if not isolation.cgroups.enabled else (None, "")
    log(
        "isolation_selected",
        level="warning" if level in WARNINGS else "info",
        isolation=level,
        bounds=isolation.bounds(),
        cgroups=isolation.cgroups.version or f"none ({cgroup_reason})",
        uid_base=isolation.uid_base,
        python=isolation.python,
    )
    return isolation


def sweep_leftovers(isolation: Isolation, log: Callable[..., None]) -> None:
    """Remove what executions of a host that is gone left behind (a SIGKILLed host, this
    one's earlier incarnation or another's): their control groups, and the per-execution
    temp dirs of releases that had them. Something is left behind when its uid belongs
    to this host's own block (nothing runs in it yet) or to a block no live host holds;
    run sandboxes use other uids and are never touched here."""
    if isolation.uid_base is None:
        return
    verdicts: dict[int, bool] = {}

    def stale(uid: int) -> bool:
        base = uids.block_of(uid)
        if base is None:
            return False
        if base not in verdicts:
            verdicts[base] = base == isolation.uid_base or uids.block_is_free(base)
        return verdicts[base]

    groups = 0
    for parent in isolation.cgroups.parents.values():
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                prefix, _, number = name.partition("-")
                if prefix == "exec" and number.isdigit() and stale(int(number)):
                    isolation.cgroups.remove(name)
                    groups += 1
    with contextlib.suppress(OSError):
        directory = snippet_dir()
        for name in os.listdir(directory):
            prefix, _, rest = name.partition("-")
            number = rest.removesuffix(".py")
            if prefix == "exec" and number.isdigit() and stale(int(number)):
                os.unlink(os.path.join(directory, name))
    dirs = 0
    temp = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(temp):
            path = os.path.join(temp, name)
            if not name.startswith("holdfast-exec-"):
                continue
            with contextlib.suppress(OSError):
                if stale(os.lstat(path).st_uid):
                    shutil.rmtree(path, ignore_errors=True)
                    dirs += 1
    if groups or dirs:
        log("leftovers_removed", cgroups=groups, exec_dirs=dirs)
