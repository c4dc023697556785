"""The escape suite: hostile snippets and jobs against a real host with its default
containment (issue 7). Each test is one thing an attacker tries first; each was red on
the host before the bubblewrap sandbox (``unshare`` isolation, a shared filesystem, no
seccomp). An auditor runs exactly this file:

    python3 dev.py test tests/sandbox_host/test_escape.py

Executions: Unix sockets anywhere on the filesystem; loopback TCP to PostgreSQL and
Redis; reading and writing the project checkout and /root; changing the read-only root,
/dev and masks (one copy shared by a warm template's children); files left in /tmp,
/var/tmp, /dev/shm or HOME for the next execution; a concurrent neighbour's files and
processes; the host's processes; user namespaces, ptrace, mount; no_new_privs, seccomp
and capabilities as /proc/self/status shows them; filling the scratch space across many
files; a fork bomb. Hosts: one started without bubblewrap refuses to start; a non-root
host refuses unless told, and then its child cannot write the host user's files.
Runs: the job reaches neither Redis nor PostgreSQL, has no route off the sandbox, does
reach the runner API through its relay, and cannot read the runner's key.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from holdfast_wire import protocol
from sandbox_host import cgroups
from sandbox_host.sandbox import base_interpreter
from tests.integration.support import stop_runs
from tests.runner.servers import Reply, scripted_server
from tests.support.host import ROOT, connect, execute, new_id, recv_frame, send_frame, start_host
from tests.timing import scaled, wait_until

from .conftest import TOKEN
from .test_reserve import waiting_sandboxes
from .test_runs import KEY, ControlPlane

pytestmark = pytest.mark.peer

POSTGRES_SOCKET = "/run/postgresql/.s.PGSQL.5432"


HOSTS = {
    # The default: children forked by the warm template, prepared ahead (the reserve).
    "template": (),
    # The same children, forked when the execution arrives (--reserve 0).
    "template-fresh": ("--reserve", "0"),
    # The fresh-interpreter path: a bubblewrap sandbox and a new interpreter each,
    # prepared ahead, and started when the execution arrives.
    "prepared-bwrap": ("--template", "off"),
    "fresh-bwrap": ("--template", "off", "--reserve", "0"),
}


@pytest.fixture(scope="module", params=list(HOSTS))
def host(request):
    """Every escape is tried against every way a snippet starts: a warm template's child
    or a bubblewrap sandbox, each prepared ahead of time (the default reserve) or
    started when the execution arrives (``--reserve 0``)."""
    args = HOSTS[request.param]
    with start_host(TOKEN, extra_args=args) as running:
        if "--reserve" not in args:
            wait_until(lambda: waiting_sandboxes(running), timeout=20, what="the reserve to fill")
        yield running


def run(host, code: str, **kwargs) -> protocol.Result:
    ws = connect(host.url, TOKEN, timeout=scaled(30))
    try:
        result = execute(ws, textwrap.dedent(code), **kwargs)
    finally:
        ws.close()
    assert isinstance(result, protocol.Result), result
    return result


def lines(result: protocol.Result) -> list[str]:
    assert result.status == "succeeded", result.stderr
    return result.stdout.splitlines()


# --- sockets -------------------------------------------------------------------------


def test_no_unix_socket_of_the_machine_is_reachable(host, tmp_path):
    # A socket of our own on the host's /tmp, and PostgreSQL's (which once answered as
    # superuser): the snippet looks for every socket it can find and connects to each.
    ours = socket.socket(socket.AF_UNIX)
    path = f"/tmp/holdfast-escape-{uuid.uuid4().hex[:8]}.sock"
    ours.bind(path)
    ours.listen(1)
    # An abstract socket has no file: only the network namespace keeps it out of reach.
    hidden = socket.socket(socket.AF_UNIX)
    abstract = f"\0holdfast-escape-{uuid.uuid4().hex[:8]}"
    hidden.bind(abstract)
    hidden.listen(1)
    try:
        result = run(
            host,
            f"""
            import os, socket, stat
            found = []
            for top in ("/", "/run", "/var/run", "/tmp", "/var/lib", "/dev"):
                for root, dirs, files in os.walk(top):
                    if root.startswith("/proc"):
                        dirs[:] = []
                        continue
                    for name in files + dirs:
                        p = os.path.join(root, name)
                        try:
                            if stat.S_ISSOCK(os.lstat(p).st_mode):
                                found.append(p)
                        except OSError:
                            pass
            print("sockets", sorted(set(found)))
            for target in sorted(set(found)) + [{POSTGRES_SOCKET!r}, {path!r}, "/run/mysqld/mysqld.sock", {abstract!r}]:
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(target)
                    print("CONNECTED", target)
                except OSError as exc:
                    print("refused", target, exc.__class__.__name__)
            """,
            # Walking all of /usr (Chromium's included) on one CPU of a busy machine.
            timeout_ms=60_000,
        )
    finally:
        ours.close()
        hidden.close()
        os.unlink(path)
    out = lines(result)
    assert out[0] == "sockets []"
    assert not any(line.startswith("CONNECTED") for line in out), out
    assert f"refused {POSTGRES_SOCKET} FileNotFoundError" in out


@pytest.mark.parametrize("port", [5432, 6379], ids=["postgresql", "redis"])
def test_loopback_services_are_unreachable(host, port):
    # The test itself reaches the service: the refusal is the sandbox's doing.
    socket.create_connection(("127.0.0.1", port), timeout=scaled(5)).close()
    result = run(
        host,
        f"""
        import socket
        for address in ("127.0.0.1", "localhost", "::1"):
            try:
                socket.create_connection((address, {port}), timeout=2)
                print("CONNECTED", address)
            except OSError as exc:
                print("refused", address, exc.__class__.__name__)
        print("interfaces", sorted(name for _, name in socket.if_nameindex()))
        """,
    )
    out = lines(result)
    assert not any(line.startswith("CONNECTED") for line in out), out
    assert out[-1] == "interfaces ['lo']"


# --- the host's files ----------------------------------------------------------------


def test_the_checkout_and_root_are_neither_readable_nor_writable(host):
    sentinel = Path("/root") / f"holdfast-escape-{uuid.uuid4().hex[:8]}"
    sentinel.write_text("host secret")
    checkout_file = ROOT / "README.md"
    assert checkout_file.exists()
    try:
        result = run(
            host,
            f"""
            import os
            for path in ({str(checkout_file)!r}, {str(ROOT / "sandbox_host" / "exec_wrapper.py")!r},
                         {str(sentinel)!r}, "/root/.bashrc", "/etc/passwd", "/etc/shadow",
                         "/var/lib/postgresql", "/home"):
                try:
                    with open(path) as fh:
                        print("READ", path, fh.read(20))
                except OSError as exc:
                    print("unreadable", path, exc.__class__.__name__)
            for path in ({str(ROOT / "sandbox_host" / "exec_wrapper.py")!r}, {str(sentinel)!r},
                         "/root/x", "/usr/lib/x", "/etc/x", "/x"):
                try:
                    with open(path, "w") as fh:
                        fh.write("owned")
                    print("WROTE", path)
                except OSError as exc:
                    print("unwritable", path, exc.__class__.__name__)
            print("root holds", sorted(os.listdir("/")))
            """,
        )
        assert sentinel.read_text() == "host secret"
    finally:
        sentinel.unlink()
    out = lines(result)
    assert not any(line.startswith(("READ", "WROTE")) for line in out), out
    assert (
        out[-1]
        == "root holds ['bin', 'dev', 'etc', 'holdfast', 'lib', 'lib64', 'proc', 'root', 'sbin', 'tmp', 'usr', 'var']"
    )


def test_the_root_all_sandboxes_share_cannot_be_changed(host):
    # A warm template's children share one read-only root, /dev and masks, built once
    # (template.build_shared_root): every way to change them must fail, or what one
    # execution does there would greet the next. Compared with what was there before.
    result = run(
        host,
        """
        import errno, os, site
        masked = [d for d in site.getsitepackages() if os.path.isdir(d)]
        tops = ["/", "/dev", "/holdfast", "/var", *masked]

        def listing():
            found = [os.lstat(top).st_mode for top in tops]
            for top in tops:
                for name in sorted(os.listdir(top)):
                    st = os.lstat(os.path.join(top, name))
                    found.append((top, name, st.st_mode, st.st_mtime_ns))
            return found

        before = listing()
        attempts = {
            "create": lambda top: open(os.path.join(top, "planted"), "w").close(),
            "mkdir": lambda top: os.mkdir(os.path.join(top, "planted")),
            "symlink": lambda top: os.symlink("/tmp", os.path.join(top, "planted")),
            "chmod": lambda top: os.chmod(top, 0o777),
            "utime": lambda top: os.utime(top, (0, 0)),
            "xattr": lambda top: os.setxattr(top, "user.planted", b"x"),
        }
        # Refused because the file system is read-only (EROFS), which the kernel checks
        # before whose the file is: not merely because the sandbox's uid does not own it.
        for top in tops:
            for what, attempt in attempts.items():
                try:
                    attempt(top)
                    print("CHANGED", what, top)
                except OSError as exc:
                    print("refused" if exc.errno == errno.EROFS else f"WRITABLE {what} {top} {exc!r}")
        for victim in ("/dev/fd", "/dev/shm", "/var/tmp", "/dev/stdout"):
            for what, attempt in (("unlink", os.unlink), ("rename", lambda p: os.rename(p, p + "-moved"))):
                try:
                    attempt(victim)
                    print("CHANGED", what, victim)
                except OSError as exc:
                    print("refused" if exc.errno == errno.EROFS else f"WRITABLE {what} {victim} {exc!r}")
        print("masked", len(masked), "unchanged", listing() == before)
        """,
    )
    out = lines(result)
    assert out[-1] == "masked 1 unchanged True", out
    assert set(out[:-1]) == {"refused"}, [line for line in out if line != "refused"]


@pytest.mark.parametrize("place", ["/tmp", "/var/tmp", "/dev/shm", "HOME", "."])
def test_nothing_is_left_for_the_next_execution(host, place):
    where = "os.environ.get('HOME', '/tmp')" if place == "HOME" else repr(place)
    name = f"left-{uuid.uuid4().hex[:8]}"
    first = run(host, f"import os\nopen(os.path.join({where}, {name!r}), 'w').write('x')\nprint('left')")
    assert lines(first) == ["left"]
    second = run(host, f"import os\nprint(os.path.exists(os.path.join({where}, {name!r})), os.listdir({where}))")
    assert lines(second) == ["False []"]


def test_a_concurrent_neighbour_is_invisible(host):
    marker = f"neighbour-{uuid.uuid4().hex[:8]}"
    ws = connect(host.url, TOKEN, timeout=scaled(30))
    try:
        sleeper = new_id()
        code = f"import time\nopen('/tmp/{marker}', 'w').write('x')\nprint(time.time(), flush=True)\ntime.sleep(4)"
        send_frame(ws, protocol.Execute(id=sleeper, code=code, timeout_ms=60_000, memory_mb=128))
        assert recv_frame(ws) == protocol.Started(id=sleeper)
        time.sleep(scaled(1))  # a wait, not an assertion: the order is checked below
        probe = run(
            host,
            f"""
            import os, time
            print(time.time())
            hits = []
            for top in ("/", "/proc"):
                for root, dirs, files in os.walk(top):
                    if "{marker}" in files:
                        hits.append(root)
                    if root.count("/") > 4:
                        dirs[:] = []
            print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
            print("hits", hits)
            """,
        )
        neighbour = recv_frame(ws)
    finally:
        ws.close()
    out = lines(probe)
    assert isinstance(neighbour, protocol.Result) and neighbour.status == "succeeded", neighbour
    # The neighbour had written its file before the probe looked (one kernel clock).
    assert float(neighbour.stdout.split()[0]) < float(out[0])
    assert out[2] == "hits []"
    # Its own PID namespace: bubblewrap's init and the snippet, nothing of the host's.
    assert len(eval(out[1].removeprefix("pids "))) <= 3  # noqa: S307 - our own repr of a list of ints


def test_the_host_processes_are_out_of_reach(host):
    result = run(
        host,
        f"""
        import os, signal
        try:
            os.kill({host.pid}, signal.SIGKILL)
            print("KILLED")
        except OSError as exc:
            print("kill", exc.__class__.__name__)
        print("visible", sorted(p for p in os.listdir("/proc") if p.isdigit()))
        print("host visible", os.path.exists("/proc/{host.pid}/cmdline") and {host.pid} > 3)
        """,
    )
    out = lines(result)
    assert out[0] in ("kill ProcessLookupError", "kill PermissionError")
    assert out[2] == "host visible False"
    assert host.popen.poll() is None


# --- the kernel ----------------------------------------------------------------------


def test_namespaces_ptrace_and_mount_are_refused(host):
    result = run(
        host,
        """
        import ctypes, errno, os
        libc = ctypes.CDLL(None, use_errno=True)
        def call(name, *args):
            rc = getattr(libc, name)(*args)
            print(name, "OK" if rc >= 0 else errno.errorcode.get(ctypes.get_errno()))
        call("unshare", 0x10000000)                 # CLONE_NEWUSER
        call("unshare", 0x00020000)                 # CLONE_NEWNS
        call("ptrace", 16, 1, 0, 0)                 # PTRACE_ATTACH to pid 1
        call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
        call("chroot", b"/tmp")
        call("inotify_init1", 0)                    # watching a neighbour's opens
        """,
    )
    out = lines(result)
    assert out[:6] == [
        "unshare EPERM",
        "unshare EPERM",
        "ptrace EPERM",
        "mount EPERM",
        "chroot EPERM",
        "inotify_init1 EPERM",
    ]


def test_no_new_privs_seccomp_and_no_capabilities(host):
    result = run(
        host,
        """
        for line in open("/proc/self/status"):
            key = line.split(":")[0]
            if key in ("Uid", "NoNewPrivs", "Seccomp", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                print(key, line.split(":", 1)[1].split()[0])
        """,
    )
    status = dict(line.split() for line in lines(result))
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # a filter is loaded
    assert all(int(status[cap], 16) == 0 for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
    assert int(status["Uid"]) >= 61000  # the slot's own unprivileged uid


# --- its own result -------------------------------------------------------------------


def test_the_code_cannot_report_an_exit_status_no_exit_could_give(host):
    # The waiter's status pipe is the code's descriptor too: what it writes there may
    # end its execution early, as exiting would, but never claim more than an exit can.
    code = """
    import os, time
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.write(int(name), b"99999999999999999999\\n")
            except OSError:
                pass
    time.sleep(0.2)
    print("done")
    """
    result = run(host, code)
    assert (result.status, result.exit_code, result.stdout) == ("succeeded", 0, "done\n"), result


def test_the_code_cannot_pass_itself_off_as_never_read_to_run_again(host):
    # The host keeps its end of a prepared sandbox's code pipe open, and runs the code
    # again elsewhere if the sandbox was SIGKILLed with all of it unread. Code that
    # could write that many bytes back into the pipe and then die so would be run
    # again: it finds no writable end of it (the host's is close-on-exec) and no
    # reader left (the waiter closed its end before the code ran), so killing itself
    # is its own execution's end. Red with both taken away, as the test was written.
    code = """
    import os, resource, signal, stat
    source = open(__file__, "rb").read()
    limits = [resource.getrlimit(n)[0] for n in (resource.RLIMIT_AS, resource.RLIMIT_CPU)]
    payload = len(b"%d %d %d\\n" % (*limits, len(source))) + len(source)
    for name in os.listdir("/proc/self/fd"):
        try:
            if int(name) > 2 and stat.S_ISFIFO(os.fstat(int(name)).st_mode):
                os.write(int(name), b"#" * payload)
        except OSError:
            pass
    print("tried", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
    before = sum("event=execution_sandbox_died_unread" in line for line in host.log_lines)
    result = run(host, code)  # a result, never not_started
    assert result.stdout.startswith("tried\n"), result
    assert sum("event=execution_sandbox_died_unread" in line for line in host.log_lines) == before


def test_the_code_finds_itself_whole_in_its_own_file_and_cannot_change_it(host):
    # As under ``python -I /holdfast/main.py``: the file holds exactly the code (a script
    # that reads itself, inspect, a traceback of a line it has not run), read-only.
    code = textwrap.dedent(
        """\
        import sys
        with open(__file__, "rb") as fh:
            text = fh.read().decode("utf-8")
        try:
            open(__file__, "a").close()
            print("appended")
        except OSError as exc:
            print("refused", exc.errno)
        print(__file__, sys.argv[0] == __file__, len(text), repr(text[-14:]))
        # the last line, ünïcödé
        """
    )
    result = run(host, code)
    refused, itself = lines(result)
    assert refused.startswith("refused "), result.stdout
    assert itself == f"/holdfast/main.py True {len(code)} {code[-14:]!r}"


# --- resources -----------------------------------------------------------------------


def test_the_scratch_space_is_capped_as_a_whole(host):
    # Many files across every writable place: the total stops at the cap (64 MiB), not
    # at a per-file limit times the number of files.
    result = run(
        host,
        """
        import os
        total, chunk = 0, b"x" * (1024 * 1024)
        for i, place in enumerate(("/tmp", "/var/tmp", "/dev/shm", os.environ.get("HOME", "/tmp"))):
            for n in range(40):
                try:
                    with open(os.path.join(place, f"fill-{i}-{n}"), "wb") as fh:
                        for _ in range(8):
                            fh.write(chunk)
                            fh.flush()
                            total += len(chunk)
                except OSError as exc:
                    break
        print("wrote", total // (1024 * 1024))
        """,
        memory_mb=512,
        timeout_ms=30_000,
    )
    written = int(lines(result)[0].split()[1])
    assert 32 <= written <= 64, written


def test_memory_is_bounded_for_the_sandbox_as_a_whole(host):
    # Four processes of 96 MiB each stay under a 256 MiB address-space rlimit one by
    # one; together they are over the execution's memory, which its control group holds.
    result = run(
        host,
        """
        import os, time
        pids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                block = bytearray(96 * 1024 * 1024)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(3)
                os._exit(0)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        print("codes", codes)
        """,
        memory_mb=256,
        timeout_ms=30_000,
    )
    assert "cgroups=none" not in host.log()  # the start-up line names the groups in force
    killed = result.status == "failed" or any(code != 0 for code in eval(result.stdout.split("codes", 1)[1]))  # noqa: S307
    assert killed, result


def test_cpu_is_capped_for_the_sandbox_as_a_whole(host):
    """Four busy processes of one execution share one CPU's quota: its control group is
    throttled (read from the host's side, where the kernel counts it)."""
    groups, why = cgroups.detect()
    if not groups.cpu:
        pytest.skip(f"no cpu controller on this machine ({why or 'not mounted'})")
    parent = groups.parents.get("cpu") or groups.parents["unified"]
    ws = connect(host.url, TOKEN, timeout=scaled(30))
    try:
        busy = new_id()
        code = "import os, time\nfor _ in range(3):\n    os.fork()\nend = time.time() + 15\n"
        code += "while time.time() < end:\n    pass\n"
        send_frame(ws, protocol.Execute(id=busy, code=code, timeout_ms=30_000, memory_mb=256))
        assert recv_frame(ws) == protocol.Started(id=busy)

        def throttled() -> bool:
            for stat in Path(parent).glob("exec-*/cpu.stat"):
                with contextlib.suppress(OSError):
                    fields = dict(line.split() for line in stat.read_text().splitlines())
                    if int(fields.get("nr_throttled", 0)) > 0:
                        return True
            return False

        wait_until(throttled, timeout=20, what="the execution's group to be throttled")
        send_frame(ws, protocol.Cancel(id=busy))
    finally:
        ws.close()


def test_a_fork_bomb_stops_at_the_process_cap(host):
    result = run(
        host,
        """
        import os
        children = 0
        try:
            for _ in range(500):
                if os.fork() == 0:
                    import time; time.sleep(5); os._exit(0)
                children += 1
        except OSError as exc:
            print("stopped", children, exc.__class__.__name__)
        """,
        timeout_ms=20_000,
    )
    words = lines(result)[0].split()
    assert words[0] == "stopped" and int(words[1]) < 64


# --- hosts that cannot build it ------------------------------------------------------


def test_a_host_without_bubblewrap_refuses_to_start(tmp_path):
    # A PATH with everything the host needs but bubblewrap.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("setpriv",):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {**os.environ, "PATH": str(bin_dir), "HOLDFAST_SANDBOX_TOKEN": TOKEN}
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_host", "--listen", "127.0.0.1:0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("holdfast-host: refusing to start:") and "apt-get install bubblewrap" in last


def _as_nobody(*args: str, env: dict[str, str], code: Path) -> subprocess.Popen[str]:
    """The host as an unprivileged user, on the system's interpreter (our venv's lies
    under /root, out of that user's reach) with ``code`` (a readable copy of our
    packages) on its path: the checkout itself may sit where only root can enter."""
    command = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "/usr/bin/python3",
        "-m",
        "sandbox_host",
    ]
    env = {**env, "PYTHONPATH": str(code), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [*command, *args], cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def nobody_code():
    """``sandbox_host``, the wire package it shares with the control plane, and the two
    packages it imports beyond the standard library, in a directory every user may read."""
    import pyseccomp
    import websockets

    target = Path(tempfile.mkdtemp(prefix="holdfast-nobody-code-"))
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "sandbox_host", target / "sandbox_host", ignore=skip)
    shutil.copytree(ROOT / "holdfast_wire", target / "holdfast_wire", ignore=skip)
    shutil.copytree(Path(websockets.__file__).parent, target / "websockets", ignore=skip)
    shutil.copy2(pyseccomp.__file__, target / "pyseccomp.py")
    for path in (target, *target.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield target
    shutil.rmtree(target, ignore_errors=True)


needs_system_python = pytest.mark.skipif(
    not os.path.exists("/usr/bin/python3"), reason="the non-root host runs on the system's /usr/bin/python3"
)


@needs_system_python
def test_a_non_root_host_refuses_unless_told(tmp_path, nobody_code):
    env = {"HOLDFAST_SANDBOX_TOKEN": TOKEN}
    proc = _as_nobody("--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s"), env=env, code=nobody_code)
    try:
        _, err = proc.communicate(timeout=scaled(60))
    finally:
        proc.kill()
    assert proc.returncode == 2, err
    assert "not root" in err.strip().splitlines()[-1] and "insecure-shared-uid" in err


@needs_system_python
def test_a_non_root_hosts_child_cannot_write_the_host_users_files(tmp_path, nobody_code):
    nobody = pwd.getpwnam("nobody")
    home = Path(f"/tmp/holdfast-nobody-{uuid.uuid4().hex[:8]}")
    home.mkdir()
    target = home / "owned-by-the-host-user"
    target.write_text("intact")
    for path in (home, target):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    state = home / "state"
    proc = _as_nobody(
        "--listen",
        "127.0.0.1:0",
        "--isolation",
        "insecure-shared-uid",
        "--state-dir",
        str(state),
        env={"HOLDFAST_SANDBOX_TOKEN": TOKEN},
        code=nobody_code,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("holdfast-host listening ws://"), proc.stderr.read() if not line else line
        url = line.split()[2]
        ws = connect(url, TOKEN, timeout=scaled(30))
        try:
            result = execute(
                ws,
                textwrap.dedent(
                    f"""
                    import os
                    print("uid", os.getuid())
                    for path in ({str(target)!r}, {str(home / "new")!r}):
                        try:
                            open(path, "w").write("owned")
                            print("WROTE", path)
                        except OSError as exc:
                            print("unwritable", exc.__class__.__name__)
                    """
                ),
            )
        finally:
            ws.close()
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=scaled(20))
        proc.kill()
    out = lines(result)
    assert out[0] == "uid 1000"
    assert not any(line.startswith("WROTE") for line in out), out
    assert target.read_text() == "intact" and not (home / "new").exists()
    shutil.rmtree(home, ignore_errors=True)


# --- runs ----------------------------------------------------------------------------


@pytest.fixture
def state_dir(tmp_path):
    yield tmp_path
    stop_runs(tmp_path)


class Probing(ControlPlane):
    """The runner API for one job, which also answers the job's own request to it."""

    def __init__(self, command: str) -> None:
        super().__init__(command)
        self.probes: list[str] = []

    def __call__(self, request):
        if request.path.endswith("/escape-probe"):
            self.probes.append(request.path)
            return Reply(200, {"reached": True})
        return super().__call__(request)


JOB = r"""
import http.client, json, os, socket
def tcp(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2)
        return "CONNECTED"
    except OSError as exc:
        return exc.__class__.__name__
print("redis", tcp(6379))
print("postgresql", tcp(5432))
routes = [l.split()[:2] for l in open("/proc/net/route").read().splitlines()[1:]]
routes6 = [l.split()[-1] for l in open("/proc/net/ipv6_route").read().splitlines()]
print("routes", routes, "routes6", sorted(set(routes6)))
print("interfaces", sorted(n for _, n in socket.if_nameindex()))
conn = http.client.HTTPConnection("control-plane")
conn.sock = socket.socket(socket.AF_UNIX)
conn.sock.connect(os.environ.get("HOLDFAST_CONTROL_PLANE_SOCKET", "/holdfast/sock/api.sock"))
conn.request("GET", "/escape-probe")
print("api", conn.getresponse().status)
"""


def python_job(code: str) -> str:
    """A shell command that runs ``code`` on the interpreter the sandbox binds."""
    encoded = base64.b64encode(code.encode()).decode()
    return f"{base_interpreter()[0]} -c \"import base64; exec(base64.b64decode('{encoded}'))\""


def run_job(plane: ControlPlane, state_dir) -> None:
    """Launch one run on a real host whose runner API is ``plane``; wait for its result."""
    with scripted_server(plane) as cp, start_host(TOKEN, extra_args=("--state-dir", str(state_dir))) as host:
        ws = connect(host.url, TOKEN)
        try:
            run_id = str(uuid.uuid4())
            send_frame(ws, protocol.LaunchRun(id=run_id, key=KEY, control_plane_url=cp.url))
            assert recv_frame(ws) == protocol.RunLaunched(id=run_id, already=False)
            wait_until(lambda: plane.results, timeout=30, what="the run's result")
        finally:
            ws.close()


def test_a_runs_job_reaches_the_runner_api_and_nothing_else(state_dir):
    plane = Probing(python_job(JOB))
    run_job(plane, state_dir)
    out = {line.split()[0]: line for line in plane.lines}
    assert out["redis"] == "redis ConnectionRefusedError", plane.lines
    assert out["postgresql"] == "postgresql ConnectionRefusedError"
    # Read from the sandbox's own tables, without sending a packet anywhere: no IPv4
    # route at all (no default route, nothing link-local or private), IPv6 routes only
    # through the loopback device, and no interface but lo.
    assert out["routes"] in ("routes [] routes6 ['lo']", "routes [] routes6 []"), out["routes"]
    assert out["interfaces"] == "interfaces ['lo']"
    assert out["api"] == "api 200" and plane.probes == ["/escape-probe"]


def test_a_runs_job_cannot_read_the_runners_key(state_dir):
    command = (
        "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>&1; echo; done; "
        "for p in /proc/[0-9]*; do head -c 64 $p/mem 2>&1 | head -c 200; echo; ls -l $p/fd 2>&1 | head -20; done; "
        "grep -r . /holdfast /tmp 2>/dev/null | head -50; ls -la /holdfast /holdfast/sock"
    )
    plane = ControlPlane(command)
    run_job(plane, state_dir)
    output = "\n".join(plane.lines)
    assert "Permission denied" in output and "api.sock" in output, output  # it did look
    assert KEY not in output and TOKEN not in output


def test_a_runs_job_cannot_plant_code_where_the_runner_imports_from(state_dir):
    """The runner (it holds the key) imports its own package and the wire's logfmt from
    /holdfast/lib: both are read-only binds, so a job cannot change what it runs."""
    job = python_job(
        "import os\n"
        "for path in ('/holdfast/lib/runner/log.py', '/holdfast/lib/holdfast_wire/logfmt.py',\n"
        "             '/holdfast/lib/holdfast_wire/planted.py', '/holdfast/lib/planted.py'):\n"
        "    try:\n"
        "        open(path, 'a').write('# planted')\n"
        "        print('WROTE', path)\n"
        "    except OSError as exc:\n"
        "        print('unwritable', path, exc.__class__.__name__)\n"
        "print('sees', sorted(os.listdir('/holdfast/lib')))\n"
    )
    plane = ControlPlane(job)
    run_job(plane, state_dir)
    assert "sees ['holdfast_wire', 'runner']" in plane.lines, plane.lines  # it did look
    assert sum(line.startswith("unwritable ") for line in plane.lines) == 4, plane.lines
    assert not any(line.startswith("WROTE") for line in plane.lines)


def test_a_relay_carries_only_to_the_control_plane(state_dir):
    """What a job sends down the relay lands at the control plane's address whatever it
    asks for: an HTTP request naming another host is still answered by the control plane."""
    job = python_job(
        "import http.client, socket\n"
        "c = http.client.HTTPConnection('127.0.0.1', 6379)\n"
        "c.sock = socket.socket(socket.AF_UNIX)\n"
        "c.sock.connect('/holdfast/sock/api.sock')\n"
        "c.request('GET', '/escape-probe', headers={'Host': '127.0.0.1:6379'})\n"
        "print('status', c.getresponse().status)\n"
    )
    plane = Probing(job)
    run_job(plane, state_dir)
    assert "status 200" in plane.lines and plane.probes == ["/escape-probe"]


def test_user_code_gets_the_bare_interpreter_and_nothing_installed_beside_it(host):
    result = run(
        host,
        """
        import os, site, sys
        dirs = [p for p in site.getsitepackages() + sys.path if p.endswith(("site-packages", "dist-packages"))]
        print("installed", sorted({name for d in dirs if os.path.isdir(d) for name in os.listdir(d)}))
        for name in ("IPython", "django", "websockets", "pyseccomp"):
            try:
                __import__(name)
                print("IMPORTED", name)
            except ImportError:
                pass
        """,
    )
    assert lines(result) == ["installed []"]


def test_socket_families_no_namespace_covers_are_refused(host):
    result = run(
        host,
        """
        import socket
        for name in ("AF_VSOCK", "AF_PACKET", "AF_BLUETOOTH", "AF_ALG", "AF_CAN", "AF_TIPC", "AF_RDS"):
            family = getattr(socket, name, None)
            if family is None:
                continue
            try:
                socket.socket(family, socket.SOCK_STREAM if name == "AF_VSOCK" else socket.SOCK_RAW).close()
                print("OPENED", name)
            except OSError as exc:
                print("refused", name, exc.errno)
        for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):
            socket.socket(family, socket.SOCK_STREAM).close()
        print("ok")
        """,
    )
    out = lines(result)
    assert out[-1] == "ok" and "refused AF_VSOCK 97" in out, out  # EAFNOSUPPORT
    assert not any(line.startswith("OPENED") for line in out), out
