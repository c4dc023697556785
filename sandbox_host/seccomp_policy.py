"""The seccomp filter every sandbox runs under, compiled once per host with libseccomp.

DESIGN.md (Containment): no_new_privs, no capabilities and "a seccomp filter". The
filter is a denylist on top of what the rest of the sandbox already takes away: the
syscalls below are how code that holds no capability still reaches the kernel's
privileged or rarely-hardened surface (namespaces, mounts, tracing, keyrings, BPF,
io_uring, module loading, ...). The list follows Docker's default profile (the calls it
leaves out) plus what a code-execution sandbox has no use for at all (``ptrace``,
``process_vm_*``, ``io_uring_*``). Refused calls fail with ``EPERM`` so a library that
probes for a feature sees "not permitted", never a dead process; ``clone3`` fails with
``ENOSYS`` so glibc falls back to ``clone``, whose flags a filter can read.

Syscalls of another ABI (i386, x32) are refused outright: libseccomp's filter for the
native architecture kills a process that uses them (its default bad-arch action).

The compiled program is handed to bubblewrap (``bwrap --seccomp FD``), which loads it
as the last step before it executes the sandbox's first program; nothing we wrote is
assembled by hand.
"""

from __future__ import annotations

import errno
import os
import tempfile

# Each name is refused outright. Grouped by what it would give hostile code.
DENIED: dict[str, tuple[str, ...]] = {
    # New or other namespaces: a user namespace hands its creator every capability
    # inside it, the usual first step of a kernel exploit.
    "namespaces": ("unshare", "setns"),
    # Reading or steering another process.
    "tracing": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
    # Filesystems and the root.
    "mounts": (
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
        "open_by_handle_at",
        "name_to_handle_at",
        "quotactl",
        "quotactl_fd",
    ),
    # The kernel's keyrings, BPF, perf and userfaultfd: large, frequently exploited.
    "kernel": (
        "bpf",
        "keyctl",
        "add_key",
        "request_key",
        "perf_event_open",
        "userfaultfd",
        "lookup_dcookie",
        "fanotify_init",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        # Watching shared read-only files tells one sandbox when another opens them.
        "inotify_init",
        "inotify_init1",
        "inotify_add_watch",
    ),
    # Kernel code and the machine itself.
    "machine": (
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "syslog",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "iopl",
        "ioperm",
        "uselib",
        "ustat",
        "sysfs",
        "vhangup",
        "nfsservctl",
        "mbind",
        "migrate_pages",
        "move_pages",
        "set_mempolicy",
    ),
}

# clone(2) flags that create namespaces (linux/sched.h). A clone carrying any is refused.
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}
# Socket families a sandbox may open: its own loopback (inet, inet6), Unix sockets (its
# namespace's abstract ones, a run's relay socket) and netlink (which interfaces and
# addresses exist; glibc asks it). Every other family is refused: some are not covered
# by any namespace (AF_VSOCK reaches the hypervisor and shares one port space with the
# host), the rest (packet, bluetooth, can, alg, ...) are kernel surface nobody needs.
ALLOWED_SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
# One past the highest family number the kernel knows (AF_MAX, linux/socket.h, 6.x).
AF_MAX = 46

# personality(2) may only be queried (0xffffffff): setting it changes how the kernel
# treats the process (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE turns off ASLR for what it
# executes). The sandbox already runs the default personality, so nothing needs to set it.
PERSONALITY_QUERY = 0xFFFFFFFF


# prctl(PR_SET_PDEATHSIG) is refused in a template child (``compile_filter(template=True)``):
# it is its PID namespace's init, and its own parent-death signal is what ends it (and
# with it, everything it started) when its template or host dies; code that could clear
# it would outlive a killed host. Under bubblewrap the code is not the init (bubblewrap
# is, dying with the host), so a job's tools may set their own as they like.
PR_SET_PDEATHSIG = 1


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its Python binding) cannot build the filter on this machine."""


def _seccomp():
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:  # OSError: the binding found no libseccomp.so
        raise SeccompUnavailable(
            f"cannot load libseccomp ({exc.__class__.__name__}); install Debian's libseccomp2 "
            "and `pip install -r requirements.txt` (pyseccomp)"
        ) from None
    return pyseccomp


def compile_filter(*, template: bool = False) -> bytes:
    """The BPF program for this machine's architecture, as bwrap reads it; with
    ``template``, the one a template child loads (one rule more, above)."""
    sc = _seccomp()
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        deny = sc.ERRNO(errno.EPERM)
        for names in DENIED.values():
            for name in names:
                try:
                    flt.add_rule(deny, name)
                except (ValueError, RuntimeError, OSError):
                    # A syscall this architecture does not have cannot be reached either.
                    continue
        for flag in CLONE_NAMESPACE_FLAGS.values():
            flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        allowed = set(ALLOWED_SOCKET_FAMILIES.values())
        for family in range(AF_MAX):
            if family not in allowed:
                flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.EQ, family))
        flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.GE, AF_MAX))
        # clone3 passes its flags in memory a filter cannot read: make glibc use clone.
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        flt.add_rule(deny, "personality", sc.Arg(0, sc.NE, PERSONALITY_QUERY))
        if template:
            # prctl's option is an int: the kernel reads its low 32 bits only, so the
            # rule must too, or PR_SET_PDEATHSIG | 1 << 32 passes it.
            flt.add_rule(deny, "prctl", sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, PR_SET_PDEATHSIG))
        with tempfile.TemporaryFile() as fh:
            flt.export_bpf(fh)
            fh.flush()
            fh.seek(0)
            program = fh.read()
    except SeccompUnavailable:
        raise
    except Exception as exc:
        raise SeccompUnavailable(f"libseccomp could not build the filter ({exc.__class__.__name__}: {exc})") from None
    if not program:
        raise SeccompUnavailable("libseccomp produced an empty filter")
    return program


def program_fd(program: bytes) -> int:
    """A fresh, inheritable file descriptor holding ``program`` from offset 0 (bwrap
    reads it to the end). One per sandbox: a shared descriptor shares its offset."""
    fd = os.memfd_create("holdfast-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
