"""The warm template: one long-lived interpreter per host that forks one single-use,
contained child per execution (DESIGN.md: "a warm template process that forks one
single-use child per execution, which enters its containment before the user's code
is even compiled").

The host starts it as ``python -I -S - holdfast-template FD`` with its source on stdin
(so nothing of the host's paths shows in any child's /proc/self/cmdline), an EMPTY
environment, and no descriptor but the Unix socket ``FD``: it never holds the host's
token or any secret, only the sandbox layout, the seccomp program and the waiter's
source, which every sandbox sees anyway. ``-S``: nothing of site-packages runs here, not
even a ``.pth`` file; only the standard library is imported. ``prepare_site`` later
runs ``site`` as a sandbox would, in the shared root where site-packages is masked
empty (those that existed when the host started; ``prepare_site`` leaves any other
to each child), and imports nothing after it.

Protocol (SOCK_SEQPACKET, one JSON object per message, descriptors by SCM_RIGHTS):

    host -> template   config {layout, seccomp, waiter source, ...}   (once)
    template -> host   {"ready": pid}
    host -> template   request {uid, cgroups, rlimits, nice, snippet} + fds
                       [code (read), status (write), stdout, stderr, exit (write)]
    template -> host   {"pid": child pid} + [pidfd of it]   or   {"error": "..."}

Each request forks one child as pid 1 of a new PID namespace (the template unshares
the PID namespace for its next child only, then goes back to its own). The template
stays its parent, as bubblewrap's outer process stays its sandbox's: it reaps it and
writes its raw wait status down the exit pipe, which is how the host, that is not its
parent, learns the end. The child dies with the template (PR_SET_PDEATHSIG), and the
template with the host.

The template builds, once and in a mount namespace of its own, the part of the
private root that ``sandbox.py`` describes which is the same for every sandbox (the
read-only binds, masks and /dev; ``build_shared_root``), empties its own capability
bounding set and runs ``site`` as ``python -I`` would (``prepare_site``): every child
inherits the three with the fork. The child takes its own session, joins the
execution's control groups, enters new mount, network, IPC, UTS and cgroup namespaces
(its mount namespace a copy of the template's), adds its own /proc, scratch space and
snippet to that root (``enter_root``), pivots into it, takes the execution's
environment, rlimits and slot uid, drops every capability, sets no_new_privs, loads the
seccomp filter, reseeds the random generators, forgets this module, and only then
becomes the waiter (``waiter.py``): it reads one header and the code from the code pipe
and runs it. Any setup failure exits 126 with one line on the execution's stderr,
before anything of the user's ran.

Standard library only; single-threaded (it forks).
"""

import _signal
import _socket
import ctypes
import fcntl
import gc
import json
import os
import platform
import re
import select
import signal
import socket
import struct
import sys
import types

# The modules user code commonly needs, imported once here so no child pays for them.
WARM = (
    "abc argparse array base64 bisect calendar collections collections.abc contextlib copy csv "
    "dataclasses datetime decimal difflib enum fnmatch fractions functools glob hashlib heapq hmac "
    "io itertools json linecache locale math numbers operator pathlib pprint queue random re "
    "resource secrets shlex shutil site statistics string struct tempfile textwrap threading time "
    "traceback types typing unicodedata uuid warnings weakref zlib"
).split()

SETUP_FAILED_EXIT = 126
# linux/sched.h
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# linux/mount.h
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# statvfs f_flag -> the mount flag to keep when remounting a bind (a remount replaces them all).
KEEP_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME}
ST_RELATIME = 4096
# linux/sockios.h, linux/if.h
SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40
# linux/prctl.h
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# What bubblewrap keeps read-only inside a fresh /proc (its setup_newroot does the same).
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


# Built once here, read by every child. A child's set-up costs mostly the template's
# pages it copies by touching them (bench/child_faults.py): each Python object built and
# each wrapper function run in a child copies some, so what is the same for every child
# is made here, and the child calls the C functions beneath the wrappers.
CAP_HEADER = CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
NO_CAPABILITIES = (CapData * 2)()  # all zero: the inheritable set too
LOOPBACK_UP = struct.pack("16sH22x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING)


def check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def prctl(option: int, arg: int = 0, what: str = "prctl") -> None:
    check(libc.prctl(option, arg, 0, 0, 0), what)


def name_buffer(name: str) -> ctypes.Array:
    """A name for ``set_name``: /proc/self/comm holds at most 15 bytes."""
    return ctypes.create_string_buffer(name.encode()[:15])


def set_name(buffer: ctypes.Array) -> None:
    prctl(PR_SET_NAME, ctypes.addressof(buffer))


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    check(libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {target}")


def remount(target: str, flags: int) -> None:
    """Remount the bind at ``target`` with ``flags`` added to the ones it has."""
    found = os.statvfs(target).f_flag
    keep = sum(flag for bit, flag in KEEP_FLAGS.items() if found & bit)
    keep |= MS_RELATIME if found & ST_RELATIME else 0
    mount(None, target, None, MS_BIND | MS_REMOUNT | keep | flags)


# --- the template --------------------------------------------------------------------


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[2]))
    config = json.loads(sock.recv(1 << 20))
    host = config["host_pid"]
    # The template dies with the host (its supervising thread); a host already gone
    # leaves nothing to serve.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != host:
        os._exit(1)
    del host  # every child starts in this frame: nothing of the host's for it to find
    os.umask(0o022)
    for name in WARM:
        __import__(name)
    waiter = types.ModuleType("holdfast_waiter")
    exec(compile(config.pop("waiter"), "/holdfast/waiter.py", "exec"), waiter.__dict__)  # noqa: S102
    program = bytes.fromhex(config.pop("seccomp"))
    buffer = ctypes.create_string_buffer(program, len(program))
    # The buffer stays referenced beside the struct that points into it.
    config["seccomp"] = (buffer, SockFprog(len(program) // 8, ctypes.addressof(buffer)))
    config["names"] = (name_buffer(config.pop("comm")), name_buffer(config.pop("waiting_name")))
    os.makedirs(config["newroot"], mode=0o755, exist_ok=True)
    build_shared_root(config)
    # Once here rather than in every child: both are inherited by a fork.
    drop_bounding_set(int(open("/proc/sys/kernel/cap_last_cap").read()))
    config["site_done"] = prepare_site(config)
    # Children share our heap copy-on-write: a collection in each would touch (copy) it.
    gc.collect()
    gc.freeze()
    # What each child takes out of sys.modules before the code runs: this module.
    config["forget"] = [name for name in sys.modules if name == "__main__" or name.startswith("holdfast")]
    # A child that exited is reaped (and reported) at once: until then it is a zombie
    # that holds the execution's control groups, and the host waits for its status.
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    config["wake"] = (wake_r, wake_w)
    config["pid_ns"] = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        reap()
        ready, _, _ = select.select([sock, wake_r], [], [], 1.0)
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 4096):
                        break
                except BlockingIOError:
                    break
        if sock in ready:
            serve_one(sock, config, waiter)


def serve_one(sock: socket.socket, config: dict, waiter: types.ModuleType) -> None:
    """One request, in a frame of its own: a child forked here finds this request in
    the frames above its code, never an earlier one's reply (another child's pid)."""
    try:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
    except OSError:
        os._exit(1)
    if not message:
        os._exit(0)  # the host closed its end
    try:
        reply, reply_fds = spawn(json.loads(message), fds, config, waiter, sock), []
        pidfd = os.pidfd_open(reply["pid"])  # our unreaped child: its pid cannot be reused yet
        reply_fds.append(pidfd)
    except Exception as exc:  # the host answers this request not_started
        reply, reply_fds = {"error": f"{exc.__class__.__name__}: {exc}"}, []
    finally:
        for fd in fds:
            os.close(fd)
    try:
        socket.send_fds(sock, [json.dumps(reply).encode()], reply_fds)
    finally:
        for fd in reply_fds:
            os.close(fd)


# Our live children: pid -> (its exit pipe's write end, its alive pipe's write end).
CHILDREN: dict[int, tuple[int, int]] = {}


def reap() -> None:
    """Report each child that ended: its raw wait status down its exit pipe (the host
    is not its parent, so this is how it learns the end). Explicitly (not SIGCHLD
    ignored), so a child's pid stays ours until we sent its pidfd."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exit_fd, alive_fd = CHILDREN.pop(pid, (-1, -1))
        if exit_fd >= 0:
            try:
                os.write(exit_fd, b"%d\n" % status)
            except OSError:
                pass  # the host let it go already
            os.close(exit_fd)
            os.close(alive_fd)


def spawn(request: dict, fds: list[int], config: dict, waiter: types.ModuleType, sock: socket.socket) -> dict:
    """Fork the sandbox as pid 1 of a new PID namespace, directly: we are its parent,
    reap it and write its wait status down its exit pipe (``reap``), as bubblewrap's
    outer process does for its sandbox. One fork per execution, not two."""
    exit_fd = fds[4]
    alive_r, alive_w = os.pipe()  # the sandbox sees EOF here once we are gone
    # Our next child starts a PID namespace of its own; we stay where we are.
    check(libc.unshare(CLONE_NEWPID), "unshare a PID namespace")
    try:
        pid = os.fork()
    except BaseException:
        pid_ns_reset(config)
        os.close(alive_r)
        os.close(alive_w)
        raise
    if pid == 0:
        os.close(alive_w)
        sandbox(request, config, waiter, sock, fds, alive_r)
    pid_ns_reset(config)
    os.close(alive_r)
    CHILDREN[pid] = (os.dup(exit_fd), alive_w)
    if request.get("nice"):
        # Set here, before the host hears of the child, not by the child itself: the
        # host restores it when the execution arrives, which may be at once, and a
        # child lowering itself after that would run the code at low priority.
        try:
            os.setpriority(os.PRIO_PROCESS, pid, request["nice"])
        except OSError:
            pass  # a priority is fairness, not containment
    return {"pid": pid}


def pid_ns_reset(config: dict) -> None:
    """Back to our own PID namespace for our next children (an unshare of a PID
    namespace applies to the children only, and only once until reset). A template
    that cannot is of no use: it exits, and the host starts a new one."""
    if libc.setns(config["pid_ns"], CLONE_NEWPID) != 0:
        os._exit(1)


def fail(exc: BaseException) -> None:
    try:
        os.write(2, f"holdfast: sandbox setup failed: {exc.__class__.__name__}: {exc}\n".encode())
    finally:
        os._exit(SETUP_FAILED_EXIT)


def sandbox(
    request: dict, config: dict, waiter: types.ModuleType, sock: socket.socket, fds: list[int], alive_fd: int
) -> None:
    """Pid 1 of the new PID namespace: contain, drop, then wait for the code. Nothing
    here may return into the template's loop."""
    code_fd, status_fd, out_fd, err_fd, _ = fds
    try:
        os.close(sock.detach())  # the template's socket must never reach a sandbox
        signal.set_wakeup_fd(-1)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # signal.signal is a wrapper
        for fd in config["wake"]:
            os.close(fd)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive_fd], [], [], 0)[0]:
            os._exit(SETUP_FAILED_EXIT)  # the template died before we could follow it
        os.setsid()  # own session and process group: the host's killpg reaches all of it
        for procs in request["cgroups"]:
            # os.open, not open(): no file object to build (its pages copied) per child.
            fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")  # ourselves (our pid here is 1, not the host's view of it)
            finally:
                os.close(fd)
        # The cgroup namespace after joining, so its root is the execution's own group.
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP), "unshare")
        loopback_up()
        enter_root(request, config)
        check(libc.sethostname(b"holdfast", 8), "sethostname")
        keep = {0, 1, 2, code_fd, status_fd, alive_fd}
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass  # listdir's own descriptor, already closed
        os.environ.clear()
        os.environ.update(config["env"])
        os.chdir(config["scratch"])
        import resource

        for number, value in request["rlimits"]:  # [resource number, limit], from the host
            resource.setrlimit(number, (value, value))
        drop_privileges(request["uid"])
        # The uid change cleared the parent-death signal (the kernel does so on any
        # credential change): take it again, and check the template did not die meanwhile.
        # Before the filter, which refuses this prctl to the code that runs next.
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive_fd], [], [], 0)[0]:
            os._exit(SETUP_FAILED_EXIT)
        os.close(alive_fd)
        confine(config)
    except BaseException as exc:
        fail(exc)
    reseed()
    # The template's bookkeeping is ours by copy: others' executions in flight
    # (``CHILDREN``), this request and the layout must not be there for the code to read
    # through a frame or the garbage collector.
    CHILDREN.clear()
    comm, waiting_name = config["names"]
    site_done = config["site_done"]
    forget = config["forget"]
    config.clear()
    request.clear()
    site_for_child(site_done)
    set_name(waiting_name)
    for name in forget:
        sys.modules.pop(name, None)

    def arrived() -> None:
        # Back to the name a fresh interpreter would have, now that it runs the code.
        set_name(comm)

    if not select.select([code_fd], [], [], 0)[0]:
        waiter.rehearse()  # prepared ahead: while it waits (forked on arrival: no time to gain)
    waiter.serve(code_fd, status_fd, arrived)
    os._exit(0)


def build_shared_root(config: dict) -> None:
    """The part of ``sandbox.py``'s private root that is the same for every sandbox,
    built once, in the template's own mount namespace: each child's new mount namespace
    starts as a copy of it, so the child only adds what is its own (``enter_root``).

    Everything here ends read-only (root, /dev, the masks), and no sandbox holds a
    capability or may call mount, so what the sandboxes share is what they could
    already read in the binds of the host's own files: nothing one writes reaches
    another. Bubblewrap's order, as a fresh sandbox has it."""
    check(libc.unshare(CLONE_NEWNS), "unshare a mount namespace")
    # Nothing of ours propagates back to the host, nor the host's later mounts to us.
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    new = config["newroot"]
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")

    def at(path: str) -> str:
        return new + path

    for parent in config["parents"]:
        os.mkdir(at(parent), 0o755)
        os.chmod(at(parent), 0o755)  # noqa: S103 - the sandbox's uid must traverse them (umask aside)
    bound: list[tuple[str, int]] = []
    for path in config["binds"]:
        bound.append(bind(new, path, path, MS_RDONLY | MS_NOSUID | MS_NODEV))
    for target, link in config["symlinks"]:
        os.symlink(target, at(link))
    for path in config["masks"]:
        os.makedirs(at(path), mode=0o755, exist_ok=True)
        mount("tmpfs", at(path), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0555,size=4096")
        remount(at(path), MS_RDONLY)
    os.makedirs(at("/proc"), mode=0o755, exist_ok=True)
    os.makedirs(at("/dev"), mode=0o755, exist_ok=True)
    mount("tmpfs", at("/dev"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=65536")
    for device in config["devices"]:
        bound.append(bind(new, device, device, MS_NOSUID))
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", at(f"/dev/{name}"))
    os.symlink("/proc/self/fd", at("/dev/fd"))
    os.symlink(config["scratch"], at("/dev/shm"))  # noqa: S108 - inside the private root
    remount(at("/dev"), MS_RDONLY)
    # Where each child mounts its own: the root is read-only by then.
    os.makedirs(at(config["scratch"]), exist_ok=True)
    os.symlink(config["scratch"], at("/var/tmp"))  # noqa: S108 - inside the private root
    mount_point(new, config["snippet_path"], directory=False)
    if config["shared_dir"]:
        mount_point(new, config["shared_dir"], directory=True)
    remount_below(bound)
    remount(new, MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter_root(request: dict, config: dict) -> None:
    """A child's own part of its private root, on the shared part it copied with its
    mount namespace (``build_shared_root``): /proc of its PID namespace, its scratch
    space, its snippet; then it pivots into the root and lets go of the host's."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    new = config["newroot"]
    proc = new + "/proc"
    mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_READ_ONLY:
        path = f"{proc}/{name}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            remount(path, MS_RDONLY | MS_NOSUID | MS_NODEV)
    mount("tmpfs", new + config["scratch"], "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={config['scratch_bytes']}")
    own = [bind(new, request["snippet"], config["snippet_path"], MS_RDONLY | MS_NOSUID | MS_NODEV)]
    if config["shared_dir"]:
        own.append(bind(new, config["shared_dir"], config["shared_dir"], MS_NOSUID | MS_NODEV))
        remount_below(own)  # below the shared directory: the mounts the template saw at its start
    os.chdir(new)
    number = SYS_PIVOT_ROOT[platform.machine()]
    check(libc.syscall(number, b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount the old root")
    os.chdir("/")


def mount_point(new: str, path: str, *, directory: bool) -> None:
    """An empty directory or file at ``path`` in the root being built, to mount on."""
    if directory:
        os.makedirs(new + path, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(new + path), mode=0o755, exist_ok=True)
        os.close(os.open(new + path, os.O_WRONLY | os.O_CREAT, 0o444))


def bind(new: str, source: str, path: str, flags: int) -> tuple[str, int]:
    """``source`` bound at ``path`` in the root being built, with ``flags`` added to
    the ones it has; returns (where, flags) for ``remount_below``."""
    target = new + path
    if not os.path.exists(target):
        mount_point(new, path, directory=os.path.isdir(source))
    mount(source, target, None, MS_BIND | MS_REC)
    remount(target, flags)
    return target, flags


def loopback_up() -> None:
    """A new network namespace's loopback starts down; bubblewrap brings it up, and
    code may serve and connect on 127.0.0.1 inside its own namespace."""
    probe = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)  # socket.socket is a wrapper
    try:
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, LOOPBACK_UP)
    finally:
        probe.close()


def remount_below(bound: list[tuple[str, int]]) -> None:
    """A recursive bind brings the mounts below its source along with their own flags (a
    writable, suid or device-bearing mount under /usr, say): each gets its bind's flags,
    as bubblewrap does. One read of the mount table for all binds."""
    with open("/proc/self/mountinfo", "rb") as fh:
        fields = [line.split(b" ", 5)[4] for line in fh]
    # Most mount points have nothing to unescape; the regex only runs where one does.
    points = [_unescape(field) if b"\\" in field else field.decode("utf-8", "surrogateescape") for field in fields]
    for point in points:
        below = [(top, flags) for top, flags in bound if point.startswith(top + "/")]
        if below:
            remount(point, max(below, key=lambda pair: len(pair[0]))[1])


def _unescape(field: bytes) -> str:
    """A mountinfo path: space, tab, newline and backslash come as octal escapes."""
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field).decode("utf-8", "surrogateescape")


def drop_bounding_set(cap_last: int) -> None:
    """``setpriv --bounding-set=-all``, for the template and so for every child it forks.
    The bounding set only caps what an execve may grant: the template never execs, and
    keeps the capabilities it has (``drop_privileges`` empties them in each child)."""
    for cap in range(cap_last + 1):
        prctl(PR_CAPBSET_DROP, cap, "drop a capability from the bounding set")


def prepare_site(config: dict) -> bool:
    """What ``python -I`` does at start-up and ``-S`` skipped here (``site.main()``:
    sys.path with the site-packages directories, ``exit``, ``quit``, ``help`` and the
    other builtins it adds), done once for every child instead of in each: about 0.75 ms
    of a child's set-up (``bench/child_faults.py``). Done inside the shared root (a
    chroot) and with the sandbox's environment, so it finds what a sandbox would:
    the same directories, the same masked site-packages, the same HOME.

    Returns False, and leaves it to each child (``site_for_child``), if site would run
    code found there: a ``sitecustomize`` to import, or a ``.pth`` file in a
    site-packages directory (they are masked empty, but only those that existed when the
    host started). Such code runs in each sandbox, contained, as in a fresh
    interpreter, never in the template. (``usercustomize`` is never imported under
    ``-I``.)"""
    import site
    from importlib.machinery import PathFinder

    old_root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    old_cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    old_environ = dict(os.environ)
    try:
        os.chroot(config["newroot"])
        os.chdir("/")
        os.environ.clear()
        os.environ.update(config["env"])
        if PathFinder.find_spec("sitecustomize", sys.path + site.getsitepackages()) is not None:
            return False
        for directory in site.getsitepackages():
            if os.path.isdir(directory) and any(name.endswith(".pth") for name in os.listdir(directory)):
                return False
        site.main()
        return True
    finally:
        os.environ.clear()
        os.environ.update(old_environ)
        os.fchdir(old_root)
        os.chroot(".")
        os.fchdir(old_cwd)
        os.close(old_root)
        os.close(old_cwd)


def site_for_child(site_done: bool) -> None:
    """In a child, contained: ``site`` as ``python -I`` runs it, unless the template
    did it for every child (``prepare_site``)."""
    if not site_done:
        import site

        site.main()


def drop_privileges(uid: int) -> None:
    """As ``setpriv --reuid --regid --clear-groups --inh-caps=-all`` does, the bounding
    set already empty (``drop_bounding_set``); ``confine`` adds no_new_privs and the
    seccomp filter."""
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, "clear ambient capabilities")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # to a non-zero uid: permitted and effective sets empty
    check(libc.capset(ctypes.byref(CAP_HEADER), ctypes.byref(NO_CAPABILITIES)), "capset")
    # A credential change made us non-dumpable, which leaves /proc/self owned by root:
    # /dev/stdout (-> /proc/self/fd/1) would not open. An exec resets it the same way.
    prctl(PR_SET_DUMPABLE, 1)


def confine(config: dict) -> None:
    """no_new_privs and the seccomp filter, as bubblewrap loads it: the last step."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    _, fprog = config["seccomp"]
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "load the seccomp filter")


def reseed() -> None:
    """Every random source the standard library keeps in memory, fresh from the kernel:
    a child must not replay its siblings' values (os.urandom and secrets already ask the
    kernel each time)."""
    import random
    import tempfile

    random.seed()
    tempfile._name_sequence = None  # its own Random, rebuilt on next use


if __name__ == "__main__":
    main(sys.argv)
