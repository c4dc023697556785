"""Per-sandbox control groups: memory (tmpfs pages included) and process count bounded
for a sandbox *as a whole*, where rlimits only bound each process.

DESIGN.md (Containment): "bounds on memory, processes and time for the execution as a
whole (cgroups where offered, rlimits as the floor)". Each sandbox gets one group per
controller, named after the uid it runs under (``exec-61003``, ``run-200001``): those
uids are unique on the machine while the sandbox lives (``uids``, ``run_uids``), so the
names are too. Groups are made below the host's own group, so a host that is itself
limited (a systemd unit, a container) keeps its children inside its own budget.

Both hierarchies are handled: cgroup v2 (one tree, ``memory.max`` and ``pids.max``,
production hosts) and cgroup v1 (a tree per controller, ``memory.limit_in_bytes`` and
``pids.max``). Only root can make groups; a host that cannot says so at start-up and
keeps the rlimits floor.

A sandbox joins its groups from the exec wrapper, before bubblewrap starts: the wrapper
writes its own pid into each ``cgroup.procs`` and everything it then starts is born
inside (``exec_wrapper.py``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass

from holdfast_wire import backoff

ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "pids")
# Used where mounted: caps how much CPU one sandbox may burn at once, so a run or a
# snippet spinning 64 processes cannot starve its neighbours on the host.
OPTIONAL_CONTROLLERS = ("cpu",)
# The scheduler period the CPU quota is expressed in (microseconds; the kernel's default).
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Cgroups:
    """Where this host makes groups: ``{controller: parent dir}``; empty when it cannot."""

    version: str  # "v2", "v1" or "" (none)
    parents: dict[str, str]
    # v2 only: whether the cpu controller is enabled for our tree (v1: "cpu" in parents).
    cpu_v2: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.parents)

    @property
    def cpu(self) -> bool:
        return "cpu" in self.parents or (self.version == "v2" and self.cpu_v2)

    def bounds(self) -> dict[str, str]:
        """What bounds memory, processes and CPU of a sandbox as a whole, for the
        start-up log and ``auth_ok``."""
        source = f"cgroup-{self.version}" if self.enabled else "rlimit"
        return {"memory": source, "processes": source, "cpu_rate": source if self.cpu else "none"}

    def paths(self, name: str) -> dict[str, str]:
        if self.version == "v2":
            return {"unified": os.path.join(self.parents["unified"], name)}
        return {controller: os.path.join(parent, name) for controller, parent in self.parents.items()}

    def create(self, name: str, *, memory_bytes: int, max_processes: int, cpus: float = 1.0) -> list[str]:
        """Make (or reset) the groups for ``name`` and return the ``cgroup.procs`` files
        the sandbox must join. Raises OSError if the kernel refuses."""
        if not self.enabled:
            return []
        self.remove(name)  # a leftover of the same name belongs to a dead sandbox
        joins = []
        for controller, path in self.paths(name).items():
            os.mkdir(path, 0o755)
            quota = str(max(1000, int(cpus * CPU_PERIOD_US)))
            if self.version == "v2":
                _write(path, "memory.max", str(memory_bytes))
                _write(path, "memory.swap.max", "0", optional=True)
                _write(path, "pids.max", str(max_processes))
                if self.cpu_v2:
                    _write(path, "cpu.max", f"{quota} {CPU_PERIOD_US}")
            elif controller == "cpu":
                _write(path, "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(path, "cpu.cfs_quota_us", quota)
            elif controller == "memory":
                _write(path, "memory.limit_in_bytes", str(memory_bytes))
                # With swap accounting, swap counts too: a sandbox must not page its way out.
                _write(path, "memory.memsw.limit_in_bytes", str(memory_bytes), optional=True)
            else:
                _write(path, "pids.max", str(max_processes))
            joins.append(os.path.join(path, "cgroup.procs"))
        return joins

    def set_memory(self, name: str, memory_bytes: int) -> None:
        """Change the memory bound of ``name``'s groups (a prepared sandbox meeting its
        execution). Raises OSError if the kernel refuses."""
        for controller, path in self.paths(name).items():
            if self.version == "v2":
                _write(path, "memory.max", str(memory_bytes))
            elif controller == "memory":
                # Lower the combined bound first where it is above the new one: the
                # kernel refuses memsw < memory, in either order of the two writes.
                _write(path, "memory.memsw.limit_in_bytes", str(memory_bytes), optional=True, ignore_invalid=True)
                _write(path, "memory.limit_in_bytes", str(memory_bytes))
                _write(path, "memory.memsw.limit_in_bytes", str(memory_bytes), optional=True)

    def members(self, name: str, *, one_list: bool = False) -> list[int]:
        """The processes in ``name``'s groups. ``one_list``: read only the first
        controller's list, for a sandbox whose processes have all joined its groups (a
        prepared one; a process it forks is born in its parent's groups): each list
        names them all, and on cgroup v1 each read is a tenth of a millisecond or more,
        on the path of an execution that is starting."""
        found: set[int] = set()
        for path in list(self.paths(name).values())[: 1 if one_list else None]:
            with contextlib.suppress(OSError):
                with open(os.path.join(path, "cgroup.procs")) as fh:
                    found.update(int(line) for line in fh if line.strip())
        return sorted(found)

    def oom_kills(self, name: str) -> int:
        """How many processes of ``name``'s groups the kernel killed for its memory
        bound (v2 ``memory.events``, v1 ``memory.oom_control``); 0 if unknown."""
        for controller, path in self.paths(name).items():
            if controller not in ("unified", "memory"):
                continue
            events = "memory.events" if self.version == "v2" else "memory.oom_control"
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(path, events)) as fh:
                    for line in fh:
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def kill(self, name: str) -> None:
        """SIGKILL every process in the groups, until none is left (a fork bomb forks
        while we read the list)."""
        if not self.enabled:
            return
        if self.version == "v2":
            path = self.paths(name)["unified"]
            with contextlib.suppress(OSError):
                _write(path, "cgroup.kill", "1")  # atomic, kernel 5.14+
        for attempt in range(50):
            pids = self.members(name)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            # A process that is already exiting is gone within a millisecond.
            backoff.wait(attempt, first_s=0.0005, max_s=0.01)

    def remove(self, name: str) -> None:
        """Kill what is left in the groups and remove them. Never raises."""
        if not self.enabled:
            return
        self.kill(name)
        for path in self.paths(name).values():
            # Dying processes still hold it for a moment (a template child's parent is
            # still tearing its namespaces down after it reported): retried from 1 ms,
            # doubling, about a second in all.
            deadline = time.monotonic() + 1.0
            for attempt in itertools.count():
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if not backoff.wait(attempt, first_s=0.001, max_s=0.01, deadline=deadline):
                        break


def _write(path: str, name: str, value: str, *, optional: bool = False, ignore_invalid: bool = False) -> None:
    try:
        with open(os.path.join(path, name), "w") as fh:
            fh.write(value)
    except FileNotFoundError:
        if not optional:
            raise
    except OSError as exc:
        if not (ignore_invalid and exc.errno == errno.EINVAL):
            raise


def _own_group(controller: str | None) -> str | None:
    """This process's group in ``controller``'s hierarchy (``None``: v2's), from
    /proc/self/cgroup."""
    with contextlib.suppress(OSError):
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                _, names, path = line.rstrip("\n").split(":", 2)
                if controller is None and names == "":
                    return path
                if controller is not None and controller in names.split(","):
                    return path
    return None


def detect() -> tuple[Cgroups, str]:
    """The groups this host can make, and why not when it cannot (for the log). A
    real group is made and removed to prove it."""
    if os.geteuid() != 0:
        return Cgroups("", {}), "the host is not root"
    candidates: list[tuple[str, dict[str, str]]] = []
    reasons = []
    if os.path.exists(os.path.join(ROOT, "cgroup.controllers")):  # a pure v2 mount
        try:
            candidates.append(("v2", {"unified": _v2_parent()}))
        except OSError as exc:
            reasons.append(f"v2: {exc.strerror or exc}")
    v1 = {}
    for controller in CONTROLLERS + OPTIONAL_CONTROLLERS:
        mount = os.path.join(ROOT, controller)
        own = _own_group(controller)
        if own is not None and os.path.isfile(os.path.join(mount + own, "cgroup.procs")):
            v1[controller] = os.path.normpath(mount + own)
    if all(controller in v1 for controller in CONTROLLERS):
        candidates.append(("v1", v1))
    for version, parents in candidates:
        groups = Cgroups(version, parents, cpu_v2=version == "v2" and _v2_has_cpu(parents["unified"]))
        name = f"holdfast-probe-{os.getpid()}"
        try:
            groups.create(name, memory_bytes=64 * 1024 * 1024, max_processes=8)
        except OSError as exc:
            reasons.append(f"{version}: {exc.strerror or exc}")
            continue
        finally:
            groups.remove(name)
        return groups, ""
    return Cgroups("", {}), "; ".join(reasons) or "no memory and pids controllers are mounted"


def _v2_parent() -> str:
    """v2 forbids processes in a group whose children have controllers ("no internal
    processes"), so sandboxes go in a sibling tree, ``holdfast`` under the root, with
    the controllers enabled on the way down."""
    parent = os.path.join(ROOT, "holdfast")
    os.makedirs(parent, exist_ok=True)
    for directory in (ROOT, parent):
        for controller in (*CONTROLLERS, *OPTIONAL_CONTROLLERS):
            with contextlib.suppress(OSError):
                _write(directory, "cgroup.subtree_control", f"+{controller}")
    return parent


def _v2_has_cpu(parent: str) -> bool:
    with contextlib.suppress(OSError), open(os.path.join(parent, "cgroup.subtree_control")) as fh:
        return "cpu" in fh.read().split()
    return False
