"""The sandbox one execution or one run lives in, as a bubblewrap command line.

DESIGN.md (Containment): "a private root of read-only interpreter and library binds,
fresh size-capped tmpfs scratch space, a minimal /dev, its own PID, mount, network,
IPC and UTS namespaces, a per-slot unprivileged uid, no_new_privs, no capabilities, a
seccomp filter". What the sandbox sees, and nothing else:

    /usr, /bin, /lib*, /sbin     the system's, read-only (symlinks stay symlinks)
    <interpreter prefix>         read-only, at its own path (a pyenv or /opt Python),
                                 its site-packages covered by an empty read-only tmpfs
    /etc/ld.so.cache, localtime  read-only, so the loader and time zones work
    /proc                        a fresh procfs of the sandbox's own PID namespace
    /dev                         read-only: null, zero, random, urandom, fd links
    /tmp                         ONE fresh tmpfs, capped as a whole; HOME and the
                                 working directory are /tmp, and /var/tmp and /dev/shm
                                 are links to it, so every byte it writes counts once
    /holdfast                    read-only: the snippet (executions); the runner's
                                 package and the relay's socket (runs)

Every other path, /run, /var/lib, /home, /root's other content, the project checkout
and the host's state directory included, does not exist inside. The root itself is
remounted read-only after it is built.

Privileges: a root host runs bubblewrap privileged (no user namespace, so nothing in
the sandbox is mapped to a uid that owns the host's files) and ``setpriv`` drops to the
slot's own unprivileged uid, clears the groups, empties the capability bounding set and
sets no_new_privs before the interpreter starts. The seccomp filter (``seccomp_policy``)
is loaded by bubblewrap before ``setpriv`` runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

# Where the sandbox's own read-only files go.
HOLDFAST_DIR = "/holdfast"
SNIPPET_PATH = f"{HOLDFAST_DIR}/main.py"
SCRATCH = "/tmp"  # a fresh tmpfs inside the sandbox, never the host's /tmp
# Uid/gid of user code inside a user namespace (non-root hosts only): not 0, and not the
# overflow id 65534 that unmapped host files show as.
USERNS_UID = 1000
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")


# The whole environment of an execution: nothing of the host's, only where things are.
EXECUTION_ENV = {"HOME": SCRATCH, "TMPDIR": SCRATCH, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


class SandboxUnavailable(RuntimeError):
    """A tool the sandbox needs is missing; the message says which and how to get it."""


@dataclass(frozen=True)
class Layout:
    """The read-only part of every sandbox of this host, worked out once at start-up."""

    bwrap: str
    setpriv: str
    python: str  # the interpreter user code runs in: the same path inside and out
    binds: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]  # (target, link)
    # The interpreter's site-packages dirs, covered by an empty read-only tmpfs: user
    # code gets the bare interpreter and its standard library, nothing installed beside it.
    masks: tuple[str, ...] = ()


def base_interpreter() -> tuple[str, str]:
    """The real interpreter behind ours (a venv's python is a link to it) and its prefix.
    User code gets the bare interpreter: none of the host's installed packages."""
    executable = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return executable, os.path.realpath(sys.base_prefix)


def setpriv_path() -> str:
    found = shutil.which("setpriv")
    return os.path.realpath(found) if found else "/usr/bin/setpriv"


def layout() -> Layout:
    """Raises ``SandboxUnavailable`` naming what to install."""
    bwrap = shutil.which("bwrap")
    if bwrap is not None:
        bwrap = os.path.realpath(bwrap)
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    setpriv = setpriv_path()
    if not setpriv.startswith("/usr/") or not os.path.exists(setpriv):
        raise SandboxUnavailable("setpriv is not installed under /usr (Debian/Ubuntu: apt-get install util-linux)")
    python, prefix = base_interpreter()
    binds: list[str] = []
    symlinks: list[tuple[str, str]] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            symlinks.append((os.readlink(path), path))
        elif os.path.isdir(path):
            binds.append(path)
    if not any(prefix == d or prefix.startswith(d + "/") for d in binds):
        binds.append(prefix)
    binds.extend(path for path in SYSTEM_FILES if os.path.exists(path))
    return Layout(bwrap, setpriv, python, tuple(binds), tuple(symlinks), site_packages(python))


def site_packages(python: str) -> tuple[str, ...]:
    """Where ``python`` finds installed packages (existing dirs only). Asked of the
    interpreter itself: a pyenv build, Debian's and a venv's base all differ."""
    query = "import json, site; print(json.dumps(site.getsitepackages()))"
    try:
        done = subprocess.run([python, "-I", "-c", query], capture_output=True, text=True, timeout=30, check=True)
        found = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SandboxUnavailable(f"cannot ask {python} where its packages are ({exc.__class__.__name__})") from None
    return tuple(os.path.realpath(path) for path in found if os.path.isdir(path))


@dataclass(frozen=True)
class Spec:
    """One sandbox to build."""

    # Run as this uid (root host: the slot's or the run's uid); None on a non-root host,
    # whose sandboxes use a user namespace instead.
    uid: int | None
    scratch_bytes: int
    seccomp_fd: int
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    # An execution dies with the host; a run is detached and survives it.
    die_with_parent: bool = True
    # (host fd, path inside): read-only files copied in from a descriptor (the snippet).
    data_files: tuple[tuple[int, str], ...] = ()
    # (host path, path inside): extra read-only binds (the runner's package, its socket dir).
    ro_binds: tuple[tuple[str, str], ...] = ()
    # bwrap writes the sandbox's exit status here as JSON (runs: survives a host restart).
    status_fd: int | None = None
    # A host directory bound read-write at its own path (--insecure-shared-dir: test
    # harnesses count what ran through it). Empty in production.
    shared_dir: str = ""


def _parents(paths: list[str]) -> list[str]:
    """Every ancestor directory of ``paths`` (below /), shallowest first, once each."""
    found: list[str] = []
    for path in paths:
        parts = path.strip("/").split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:depth])
            if parent not in found:
                found.append(parent)
    return sorted(found, key=lambda p: p.count("/"))


def argv(lay: Layout, spec: Spec) -> list[str]:
    # Always a network namespace of its own (loopback only): a run reaches the control
    # plane through its relay's socket, never a network.
    args = [lay.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net"]
    if spec.uid is None:
        # Not root: a user namespace is the only way in, with one unprivileged uid mapped.
        args += ["--unshare-user", "--uid", str(USERNS_UID), "--gid", str(USERNS_UID), "--disable-userns"]
    if spec.die_with_parent:
        args.append("--die-with-parent")
    args += ["--new-session", "--hostname", "holdfast", "--clearenv"]
    for name, value in spec.env:
        args += ["--setenv", name, value]
    if spec.uid is None:
        args += ["--cap-drop", "ALL"]
    else:
        # Only what setpriv needs to drop to the uid and empty the bounding set; setuid
        # to a non-zero uid then clears the rest.
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    # Parents bwrap would make itself come out 0700 (unreachable for the sandbox's uid):
    # make each one explicitly, world-readable, before anything lands in it.
    inside = [*lay.binds, *(link for _, link in lay.symlinks), "/var/tmp", *(p for _, p in spec.data_files)]
    inside += [path for _, path in spec.ro_binds] + ([spec.shared_dir] if spec.shared_dir else [])
    for parent in _parents(inside):
        args += ["--perms", "0755", "--dir", parent]
    for path in lay.binds:
        args += ["--ro-bind", path, path]
    for target, link in lay.symlinks:
        args += ["--symlink", target, link]
    for path in lay.masks:
        args += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
    args += ["--proc", "/proc"]
    # A minimal /dev of our own: four devices and the fd links, read-only.
    args += ["--perms", "0755", "--size", str(64 * 1024), "--tmpfs", "/dev"]
    for device in DEVICES:
        args += ["--dev-bind", device, device]
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        args += ["--symlink", f"/proc/self/fd/{fd}", f"/dev/{name}"]
    args += ["--symlink", "/proc/self/fd", "/dev/fd", "--symlink", SCRATCH, "/dev/shm", "--remount-ro", "/dev"]
    # The one writable place, capped as a whole.
    args += ["--perms", "1777", "--size", str(spec.scratch_bytes), "--tmpfs", SCRATCH]
    args += ["--symlink", SCRATCH, "/var/tmp"]
    for fd, path in spec.data_files:
        args += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    for source, path in spec.ro_binds:
        args += ["--ro-bind", source, path]
    if spec.shared_dir:
        args += ["--bind", spec.shared_dir, spec.shared_dir]
    args += ["--remount-ro", "/", "--chdir", SCRATCH, "--seccomp", str(spec.seccomp_fd)]
    if spec.status_fd is not None:
        args += ["--json-status-fd", str(spec.status_fd)]
    args.append("--")
    if spec.uid is not None:
        args += [
            lay.setpriv,
            f"--reuid={spec.uid}",
            f"--regid={spec.uid}",
            "--clear-groups",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--no-new-privs",
            "--",
        ]
    else:
        args += [lay.setpriv, "--no-new-privs", "--"]
    args += list(spec.command)
    return args


def hide_arguments(command: list[str]) -> tuple[list[str], int | None]:
    """``bwrap --args FD``: the whole command line moves into a descriptor, so what the
    sandbox can read of bubblewrap (its pid 1's /proc/1/cmdline) is ``bwrap --args N --
    COMMAND``, not the host's paths, binds and the run's variables. Returns the short command and the
    descriptor the caller passes on and closes; commands of no sandbox are unchanged."""
    if not command or os.path.basename(command[0]) != "bwrap":
        return command, None
    # The options go in the descriptor; bwrap wants the command itself on its own argv.
    end = command.index("--")
    fd = os.memfd_create("holdfast-bwrap-args", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"".join(part.encode() + b"\0" for part in command[1:end]))
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return [command[0], "--args", str(fd), *command[end:]], fd
