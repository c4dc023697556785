"""Which isolation this machine allows, probed once at start-up and logged.

Candidates, strongest first; the first whose probe runs a real child end to end wins:

* ``bwrap``: bubblewrap with new PID, network, IPC and UTS namespaces, a read-only view
  of the filesystem with only the execution's temp dir writable, and
  ``--die-with-parent`` so killing the wrapper kills everything inside;
* ``unshare``: util-linux ``unshare`` with new network, PID (``--fork --kill-child``,
  fresh ``/proc``), mount, IPC and UTS namespaces; needs root;
* ``unshare-user``: the same inside a new user namespace, for a host that is not root
  where unprivileged user namespaces are enabled;
* ``rlimits``: no namespaces, only the wrapper's rlimits, the empty environment, the
  process group and (as root) the per-slot uid. Logged loudly: user code then shares the
  host's network and sees its process table.

A PID namespace is what makes "kill the whole group" complete: the kernel kills every
process of a namespace when its init dies, setsid'd grandchildren included.

Run sandboxes (``runs.py``) use the same isolation with two differences, both from
``Isolation.for_runs``: no network namespace, because the runner must reach the
control plane over HTTP; and no ``--die-with-parent``, because a run outlives the host
process that started it (a host restart or drain must not kill runs).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass

from . import defaults
from .children import Child, ChildError, Limits

# ``{tmpdir}`` is replaced with the execution's temp dir.
_BWRAP = [
    "bwrap",
    "--die-with-parent",
    "--new-session",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--ro-bind", "/", "/",
    "--proc", "/proc",
    "--dev", "/dev",
    "--tmpfs", "/tmp",  # noqa: S108 - a fresh empty tmpfs inside the sandbox
    "--bind", "{tmpdir}", "{tmpdir}",
    "--chdir", "{tmpdir}",
    "--",
]  # fmt: skip
# An execution must not outlive a host that was SIGKILLed: setpriv gives unshare a
# parent-death signal (kept across its exec), and unshare's --kill-child then takes the
# whole PID namespace with it. Runs go without it: they are detached on purpose.
_DIE_WITH_HOST = ("setpriv", "--pdeathsig", "KILL")
_UNSHARE = [
    *(_DIE_WITH_HOST if shutil.which("setpriv") else ()),
    "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts", "--",
]  # fmt: skip
_UNSHARE_USER = [
    *_UNSHARE[: _UNSHARE.index("unshare") + 1],
    "--user",
    "--map-root-user",
    *_UNSHARE[_UNSHARE.index("unshare") + 1 :],
]
# Flags a run's sandbox goes without (see ``Isolation.for_runs``).
_RUN_DROPPED_FLAGS = frozenset({"--net", "--unshare-net", "--die-with-parent"})


@dataclass(frozen=True)
class Isolation:
    name: str
    prefix: tuple[str, ...]
    # Whether user code is cut off from the network (a network namespace).
    no_network: bool
    # Uid each execution slot runs under (root host only), or None to keep ours.
    uid_base: int | None
    # Interpreter user code runs in: one the child's uid can reach.
    python: str = sys.executable

    def uid_for(self, slot: int) -> int | None:
        return None if self.uid_base is None else self.uid_base + slot

    def for_runs(self) -> tuple[str, ...]:
        """The prefix a run's sandbox starts under: this one with the network kept (the
        runner talks HTTP to the control plane) and without ``--die-with-parent`` (the
        run is detached and survives the host)."""
        prefix = (
            self.prefix[len(_DIE_WITH_HOST) :] if self.prefix[: len(_DIE_WITH_HOST)] == _DIE_WITH_HOST else self.prefix
        )
        return tuple(part for part in prefix if part not in _RUN_DROPPED_FLAGS)


def candidates(*, uid_base: int | None) -> list[Isolation]:
    is_root = uid_base is not None
    # An unprivileged uid must be able to reach the interpreter (a venv under /root is not).
    python = child_python() if is_root else sys.executable
    found = []
    if shutil.which("bwrap"):
        found.append(Isolation("bwrap", tuple(_BWRAP), True, uid_base, python))
    if shutil.which("unshare"):
        if is_root:
            found.append(Isolation("unshare", tuple(_UNSHARE), True, uid_base, python))
        else:
            found.append(Isolation("unshare-user", tuple(_UNSHARE_USER), True, None, python))
    found.append(Isolation("rlimits", (), False, uid_base, python))
    return found


def child_python() -> str:
    """The first interpreter every user may execute: ours if it is reachable, else the
    system's."""
    for path in (sys.executable, os.path.realpath(sys.executable), *defaults.DEFAULT_FALLBACK_PYTHONS):
        if _world_executable(path):
            return path
    return sys.executable  # the probe will then fail and say why


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


def works(isolation: Isolation) -> tuple[bool, str]:
    """Run one trivial child through ``isolation`` exactly as an execution would."""
    probe = "import os, socket\nprint('ok', os.getuid(), ','.join(sorted(os.environ)) or '-')\n"
    child = Child(
        probe,
        Limits(timeout_ms=int(defaults.DEFAULT_PROBE_TIMEOUT_S * 1000), memory_mb=512),
        prefix=list(isolation.prefix),
        uid=isolation.uid_for(0),
        python=isolation.python,
    )
    try:
        child.start()
    except ChildError as exc:
        return False, str(exc)
    try:
        outcome = child.wait()
    finally:
        child.cleanup()
    expected_uid = isolation.uid_for(0)
    words = outcome.stdout.split()
    if outcome.status != "succeeded" or len(words) != 3 or words[0] != "ok":
        return False, f"status={outcome.status} stderr={outcome.stderr.strip()[-200:]}"
    if expected_uid is not None and words[1] != str(expected_uid):
        return False, f"child ran as uid {words[1]}, expected {expected_uid}"
    # Python's PEP 538 locale coercion may add LC_CTYPE itself; anything else leaked in.
    if set(words[2].split(",")) - {"-", "LC_CTYPE"}:
        return False, "child saw a non-empty environment"
    return True, ""


def probe(log: Callable[..., None], *, uid_base: int | None, require: str | None = None) -> Isolation:
    """Pick the strongest isolation that works here (or exactly ``require``); log every
    refusal and the choice. ``uid_base`` is the host's claimed uid block (root only).
    Raises ``RuntimeError`` when none (or not ``require``) works."""
    for isolation in candidates(uid_base=uid_base):
        if require is not None and isolation.name != require:
            continue
        ok, why = works(isolation)
        if ok:
            level = "warning" if isolation.name == "rlimits" else "info"
            log(
                "isolation_selected",
                level=level,
                isolation=isolation.name,
                no_network=isolation.no_network,
                # Runs keep the network: the runner must reach the control plane.
                runs_no_network=False,
                uid_base=isolation.uid_base,
                python=isolation.python,
            )
            return isolation
        log("isolation_unavailable", isolation=isolation.name, reason=why)
    if require is not None:
        raise RuntimeError(f"isolation {require!r} is not available on this machine")
    raise RuntimeError("no isolation works, not even rlimits")  # rlimits failing means the host cannot run code
