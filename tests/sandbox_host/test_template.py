"""The warm template (``sandbox_host/template.py``): its children share nothing of one
another, it holds nothing of the host's, and a template killed under load loses no
execution and runs none twice. The containment of its children is the escape suite's
(``test_escape.py`` runs against the template too)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from holdfast_wire import protocol
from tests.support.host import connect, descendants, execute, new_id, recv_frame, send_frame, start_host
from tests.timing import scaled, wait_until

from .conftest import TOKEN
from .test_reserve import waiting_sandboxes

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_SOURCE = ROOT / "sandbox_host" / "template.py"


def _run(host, code: str) -> protocol.Result:
    ws = connect(host.url, TOKEN)
    try:
        return execute(ws, textwrap.dedent(code))
    finally:
        ws.close()


def template_pids(host) -> list[int]:
    """The host's template process(es): the interpreter started as ``holdfast-template``
    by the host itself (its children carry the same command line)."""
    found = []
    for pid in descendants(host.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if b"holdfast-template" in argv and ppid == host.pid and pid > 1:
            found.append(pid)
    return found


def template_pid(host) -> int:
    wait_until(lambda: len(template_pids(host)) == 1, timeout=20, what="one template")
    pid = template_pids(host)[0]
    assert pid > 1
    return pid


def test_the_template_holds_nothing_of_the_hosts_environment():
    # The host gets its token from its environment, and more besides: the template's
    # environment (what it was started with) must be empty.
    env = {**os.environ, "HOLDFAST_TEST_MARKER": "host-only-" + new_id()}
    with start_host(TOKEN, env=env) as host:
        pid = template_pid(host)
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
        fds = {}
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                fds[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
    assert TOKEN.encode() not in environ and TOKEN.encode() not in cmdline
    assert environ == b"", environ
    # Beyond stdio: its one socket to the host, its own pipes (a wake-up pipe, each
    # child's exit and alive pipes), its own PID namespace, and for a moment the pidfd
    # of a child it is reporting (the reserve may be refilling); nothing of the host's.
    kinds = [
        "pidfd" if link == "anon_inode:[pidfd]" else link.split(":")[0]
        for fd, link in fds.items()
        if fd not in ("0", "1", "2")
    ]
    assert kinds.count("socket") == 1 and set(kinds) <= {"socket", "pipe", "pid", "pidfd"}, fds


SIBLING = textwrap.dedent(
    """
    import os, random, tempfile, time, uuid
    before = sorted(os.listdir("/tmp"))
    name = "sibling-" + os.urandom(4).hex()
    open("/tmp/" + name, "w").write("x")
    print(random.random(), random.getrandbits(64), uuid.uuid4().hex, os.path.basename(tempfile.mktemp()))
    print(name, before)
    print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    time.sleep({hold})
    print(sorted(os.listdir("/tmp")))
    """
)


def test_two_children_of_one_template_share_nothing():
    with start_host(TOKEN) as host:
        wait_until(lambda: len(waiting_sandboxes(host)) >= 2, timeout=20, what="the reserve to fill")
        first_template = template_pid(host)
        results: dict[str, protocol.Frame] = {}

        def one(key: str, hold: float) -> None:
            ws = connect(host.url, TOKEN)
            try:
                results[key] = execute(ws, SIBLING.format(hold=hold), timeout_ms=30_000)
            finally:
                ws.close()

        # Both alive at once: each could see the other's file or process if any leaked.
        threads = [threading.Thread(target=one, args=(key, scaled(1.5))) for key in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert template_pid(host) == first_template  # both came from the same template
    a, b = (results[key] for key in ("a", "b"))
    assert a.status == b.status == "succeeded", (a, b)
    a_out, b_out = a.stdout.splitlines(), b.stdout.splitlines()
    # Every random source differs: random's state, uuid4, tempfile's names.
    assert all(x != y for x, y in zip(a_out[0].split(), b_out[0].split(), strict=True)), (a_out[0], b_out[0])
    a_name, b_name = a_out[1].split()[0], b_out[1].split()[0]
    assert a_out[1].endswith(" []") and b_out[1].endswith(" []")  # each found /tmp empty
    assert a_out[3] == f"[{a_name!r}]" and b_out[3] == f"[{b_name!r}]"  # and only its own file later
    # Its own PID namespace: itself (pid 1), nothing of the sibling's.
    assert a_out[2] == b_out[2] == "[1]"


def test_a_template_killed_under_load_loses_nothing_and_runs_nothing_twice(shared_dir):
    ledger = shared_dir / "ran.txt"
    ledger.touch()
    ledger.chmod(0o666)
    code = "import time\nopen({ledger!r}, 'a').write({id!r} + '\\n')\ntime.sleep({sleep})\nprint('done')"
    args = ("--insecure-shared-dir", str(shared_dir))
    with start_host(TOKEN, extra_args=args) as host:
        wait_until(lambda: len(waiting_sandboxes(host)) >= 2, timeout=20, what="the reserve to fill")
        old = template_pid(host)
        ws = connect(host.url, TOKEN, timeout=scaled(60))
        try:
            # In flight when the template dies: two running, then the waiting reserve.
            running = [new_id() for _ in range(2)]
            for execution_id in running:
                body = code.format(ledger=str(ledger), id=execution_id, sleep=30)
                send_frame(ws, protocol.Execute(id=execution_id, code=body, timeout_ms=60_000, memory_mb=128))
            started = {recv_frame(ws) for _ in running}
            assert started == {protocol.Started(id=execution_id) for execution_id in running}
            wait_until(lambda: ledger.read_text().count("\n") == 2, timeout=20, what="both to be running")
            doomed = set(descendants(old))
            assert doomed, "the template has children"
            os.kill(old, signal.SIGKILL)
            # Nothing of it outlives it: its children die with it (parent-death
            # signals), the running ones well before their 30 s sleep is over.
            wait_until(
                lambda: not [pid for pid in doomed if os.path.exists(f"/proc/{pid}")],
                timeout=10,
                what="the dead template's children to be gone",
            )
            ended = {}
            while len(ended) < len(running):
                frame = recv_frame(ws)
                assert isinstance(frame, protocol.Result), frame
                ended[frame.id] = frame
            # Queued after the kill: they run on the restarted template, or are refused
            # as never started (the pool moves them); never lost, never run twice.
            later = []
            for _ in range(6):
                execution_id = new_id()
                body = code.format(ledger=str(ledger), id=execution_id, sleep=0)
                later.append((execution_id, execute(ws, body, id=execution_id)))
        finally:
            ws.close()
        new = template_pid(host)
        assert new != old
        wait_until(lambda: len(waiting_sandboxes(host)) >= 2, timeout=20, what="the reserve to refill")
    for frame in ended.values():
        # Killed with their template: failed, never hung and never lost.
        assert frame.status == "failed" and "SIGKILL" in frame.error, frame
    runs = ledger.read_text().split()
    assert all(runs.count(execution_id) == 1 for execution_id in running)
    for execution_id, frame in later:
        if isinstance(frame, protocol.NotStarted):
            assert execution_id not in runs  # provably never ran
        else:
            assert isinstance(frame, protocol.Result) and frame.status == "succeeded", frame
            assert runs.count(execution_id) == 1
    assert sum(isinstance(frame, protocol.Result) for _, frame in later) >= 5  # the restart is quick


def test_a_dead_template_is_restarted_and_the_fresh_path_uses_it_too():
    with start_host(TOKEN, extra_args=("--reserve", "0")) as host:
        old = template_pid(host)
        os.kill(old, signal.SIGKILL)
        # The next request waits for the restart rather than failing.
        ws = connect(host.url, TOKEN)
        try:
            started = time.monotonic()
            result = execute(ws, "print('after')")
        finally:
            ws.close()
        assert isinstance(result, protocol.Result) and result.stdout == "after\n", result
        assert time.monotonic() - started < scaled(10)
        assert template_pid(host) != old
        assert "event=template_exited" in host.log()


# In a process of its own, so that the templates it starts die with it.
KILLED_UNSEEN = """
import dataclasses, os, select, signal, sys
from sandbox_host import defaults, isolation, uids
from sandbox_host.children import Child, Limits
from sandbox_host.template_host import Template
from tests.timing import scaled, wait_until

# The successor's start, on a slow machine, within the wait a request gives it.
defaults.DEFAULT_TEMPLATE_WAIT_S = scaled(defaults.DEFAULT_TEMPLATE_WAIT_S)
base, lock_fd = uids.claim(1)
contained = isolation.build(isolation.FULL, uid_base=base)
template = Template(contained)
template.start()
contained = dataclasses.replace(contained, template=template)
old = template.proc.pid
pidfd = os.pidfd_open(old)
child = Child("print('after')", Limits(timeout_ms=10_000, memory_mb=256), isolation=contained, uid=base)
if sys.argv[1] == "send":
    # Held, so that the supervisor, woken by the template's death, cannot drop the
    # dead template's socket before the request is sent on it (the request then waits
    # for the restart, which releases it).
    with template._cond:
        os.kill(old, signal.SIGKILL)
        assert select.select([pidfd], [], [], 10)[0], "the template did not die"
        child.start()
else:
    # The request found the socket before the death, and the supervisor dropped it
    # before the request could use it: the request is given the dead socket first.
    stale, running_sock = template._sock, template._running_sock
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: template._sock is not stale, timeout=10, what="the supervisor to drop the socket")
    def give_stale_once():
        template._running_sock = running_sock
        return stale
    template._running_sock = give_stale_once
    child.start()
outcome = child.wait()
child.cleanup()
print(outcome.status, outcome.stdout.strip(), template.proc.pid != old, template.starts)
"""


@pytest.mark.parametrize("moment", ["send", "replaced"])
def test_a_request_sent_to_a_template_that_just_died_waits_for_its_successor(moment):
    # The moment between a template's death and its supervisor noticing: the request
    # finds the old socket, whose peer is gone ("send"), or finds it replaced once it
    # may send ("replaced"). Nothing reached a template, so nothing was started: the
    # request goes to the restarted template instead of failing the execution as
    # not_started.
    found = subprocess.run(
        [sys.executable, "-c", KILLED_UNSEEN, moment], cwd=ROOT, capture_output=True, text=True, timeout=scaled(60)
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.split() == ["succeeded", "after", "True", "2"], found.stdout


def test_a_child_holds_no_descriptor_of_the_template(host):
    # The template's socket in a child would let user code ask for children of its own
    # choosing (any uid): only stdio and the waiter's status pipe may be open.
    code = """
    import os
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink("/proc/self/fd/" + fd).split(":")[0]
        except OSError:
            pass  # the descriptor listdir held, closed since
    print(found)
    """
    result = _run(host, code)
    assert result.status == "succeeded", result
    found = eval(result.stdout)  # noqa: S307 - our own repr of a dict of strings
    extra = {fd: kind for fd, kind in found.items() if fd not in ("0", "1", "2")}
    assert set(extra.values()) <= {"pipe"} and len(extra) <= 1, found  # the status pipe at most
    assert not any(kind.startswith("socket") for kind in found.values()), found


def test_the_running_code_dies_with_its_parent(host):
    # A credential change clears the parent-death signal: the child must take it again
    # after it dropped to the slot's uid, or it would outlive a SIGKILLed host.
    code = """
    import ctypes, signal
    sig = ctypes.c_int(-1)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    print(signal.Signals(sig.value).name if sig.value > 0 else sig.value)
    """
    result = _run(host, code)
    assert result.status == "succeeded" and result.stdout == "SIGKILL\n", result


def test_the_running_code_cannot_clear_its_parent_death_signal(host):
    # It is its namespace's init: cleared, nothing would end it with a SIGKILLed host.
    # Both ways in: prctl() itself, and the raw system call with bits above the 32 the
    # kernel reads set in the option, which a filter comparing all 64 would let by.
    code = """
    import ctypes, errno, platform, signal
    libc = ctypes.CDLL(None, use_errno=True)
    SYS_PRCTL = {"x86_64": 157, "aarch64": 167}[platform.machine()]
    attempts = {
        "prctl": lambda: libc.prctl(1, 0, 0, 0, 0),  # PR_SET_PDEATHSIG, none
        "high bits": lambda: libc.syscall(ctypes.c_long(SYS_PRCTL), ctypes.c_ulong(1 << 32 | 1), ctypes.c_ulong(0)),
    }
    for way, attempt in attempts.items():
        cleared = attempt()
        refused = errno.errorcode.get(ctypes.get_errno(), "") if cleared != 0 else "accepted"
        sig = ctypes.c_int(-1)
        libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
        print(way, refused, signal.Signals(sig.value).name if sig.value > 0 else sig.value)
    """
    result = _run(host, code)
    assert result.status == "succeeded", result
    assert result.stdout == "prctl EPERM SIGKILL\nhigh bits EPERM SIGKILL\n", result


def test_a_child_has_its_own_loopback_up(host):
    code = """
    import socket
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname(), timeout=5) as client:
            peer, _ = server.accept()
            client.sendall(b"ping")
            print(peer.recv(4).decode())
    """
    result = _run(host, code)
    assert result.status == "succeeded" and result.stdout == "ping\n", result


def test_the_code_finds_none_of_the_template_s_bookkeeping_in_its_frames(host):
    # Other executions in flight (the reserve's waiting children at least), the request
    # and the layout were the template's: reachable through the frames that led here.
    code = """
    import sys
    found = []
    frame = sys._getframe()
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            for name in ("CHILDREN", "config", "request"):
                value = scope.get(name)
                if isinstance(value, dict) and value:
                    found.append((frame.f_code.co_name, name, len(value)))
        frame = frame.f_back
    print(found)
    """
    # The oldest waiting child was forked before any other lived; the next one was
    # forked while it waited, so the template's table of children was not empty then.
    wait_until(lambda: len(waiting_sandboxes(host)) >= 2, timeout=20, what="two prepared children")
    results = [_run(host, code) for _ in range(2)]
    assert all(r.status == "succeeded" and r.stdout == "[]\n" for r in results), results


@pytest.mark.parametrize("name", ["below", "below me"])
def test_a_mount_below_a_bound_directory_takes_the_bind_s_flags(tmp_path, name):
    # bubblewrap remounts every mount a recursive bind brings along; so must the template,
    # also where the mount table escapes the path (a space comes as \040).
    shared = tmp_path / "shared"
    below = shared / name
    below.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(below)], check=True)
    listed = str(below).replace(" ", "\\040")
    try:
        with start_host(TOKEN, extra_args=("--insecure-shared-dir", str(shared))) as shared_host:
            code = f"""
            for line in open("/proc/self/mountinfo"):
                fields = line.split()
                if fields[4] == {listed!r}:
                    print(",".join(sorted(set(fields[5].split(",")) & {{"nosuid", "nodev"}})))
            """
            result = _run(shared_host, code)
    finally:
        subprocess.run(["umount", "-l", str(below)], check=False)
    assert result.status == "succeeded" and result.stdout == "nodev,nosuid\n", result


def test_no_frame_of_the_template_above_the_code_holds_a_pid(host):
    # Whatever it is named: the host's pid, an earlier reply's child pid. The template's
    # own functions (its source came on stdin) hold descriptors and flags, all below
    # 300, the first pid the kernel hands out after wrapping.
    code = """
    import sys
    found = []
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_filename == "<stdin>" and frame.f_code.co_name != "<module>":
            for name, value in frame.f_locals.items():
                values = value if isinstance(value, (list, tuple)) else [value]
                values = value.values() if isinstance(value, dict) else values
                found += [(frame.f_code.co_name, name) for v in values if type(v) is int and v >= 300]
        frame = frame.f_back
    print(found)
    """
    wait_until(lambda: len(waiting_sandboxes(host)) >= 1, timeout=20, what="a prepared child")
    _run(host, "print(1)")  # an earlier request, whose reply named its child's pid
    result = _run(host, code)
    assert result.status == "succeeded" and result.stdout == "[]\n", result


def test_the_rehearsal_while_waiting_leaves_nothing_the_code_can_see(host):
    # A template's prepared child walks an execution's path on a constant before its
    # code comes (waiter.rehearse). Its code must find what the code of a sandbox
    # prepared by bubblewrap finds (the same waiter, in an interpreter of its own, with
    # no rehearsal): the same globals and cache, no object or output of the rehearsal,
    # its own limits.
    code = """
    import gc, io, linecache, resource, sys
    print(sorted(globals()), sorted(linecache.cache))
    print(sum(1 for o in gc.get_objects() if type(o) is io.StringIO or (type(o) is dict and "sink" in o)))
    print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU))
    print(sys.modules["__main__"] is sys.modules[__name__])
    """
    wait_until(lambda: len(waiting_sandboxes(host)) >= 1, timeout=20, what="a prepared child")
    prepared = _run(host, code)
    with start_host(TOKEN, extra_args=("--template", "off")) as bwrap_host:
        wait_until(lambda: len(waiting_sandboxes(bwrap_host)) >= 1, timeout=20, what="a prepared sandbox")
        fresh = _run(bwrap_host, code)
    assert prepared.status == "succeeded" and prepared.stderr == "", prepared
    assert prepared.stdout == fresh.stdout, (prepared.stdout, fresh.stdout)
    assert prepared.stdout.splitlines()[1] == "0", prepared.stdout


def test_the_code_finds_the_main_module_a_script_run_by_python_finds(host, tmp_path):
    # waiter.run stands in for ``python -I /holdfast/main.py``: the code's ``__main__``
    # must hold what a script's does (its loader reading the file, ``__cached__``,
    # ``__annotations__``), so code that reads them runs as it would from a file.
    code = """
    # read back through the loader
    print(sorted(globals()), type(__loader__).__name__, __loader__.name, __cached__, __spec__, __package__, __doc__)
    print(__loader__.get_source("__main__").splitlines()[1], len(__loader__.get_source("__main__")))
    print(globals().get("__annotations__"))
    """
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(code))
    direct = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=60)
    assert direct.returncode == 0, direct.stderr
    wait_until(lambda: len(waiting_sandboxes(host)) >= 1, timeout=20, what="a prepared child")
    result = _run(host, code)
    assert result.status == "succeeded" and result.stderr == "", result
    assert result.stdout == direct.stdout


ENDINGS = {
    "an atexit handler": """
    import atexit, threading
    atexit.register(lambda: print("atexit: main thread alive", threading.main_thread().is_alive()))
    """,
    "a thread still running": """
    import threading, time
    def late():
        time.sleep(0.3)
        print("thread: main thread alive", threading.main_thread().is_alive())
    threading.Thread(target=late).start()
    """,
    "a threading atexit callback": """
    import threading
    threading._register_atexit(lambda: print("threading atexit: main thread alive", threading.main_thread().is_alive()))
    """,
    "nothing": """
    import threading
    print("main thread alive", threading.main_thread().is_alive())
    """,
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_code_ends_as_a_script_run_by_python_ends(host, tmp_path, ending):
    # The waiter ends the way interpreter shutdown does (waiter.finish), without
    # tearing modules down: a thread left running is joined, both kinds of exit
    # callbacks run, and they find the main thread stopped.
    code = ENDINGS[ending]
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(code))
    direct = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=60)
    assert direct.returncode == 0 and direct.stdout, direct
    wait_until(lambda: len(waiting_sandboxes(host)) >= 1, timeout=20, what="a prepared child")
    result = _run(host, code)
    assert result.status == "succeeded" and result.stderr == "", result
    assert result.stdout == direct.stdout


def test_code_larger_than_a_pipe_holds_reaches_a_prepared_sandbox_whole(host):
    # deliver writes the code to the snippet's file and down the pipe the sandbox waits
    # on; the pipe takes 64 KiB at a time, so a longer code arrives in several writes.
    code = "text = '" + "ab" * 300_000 + "'\nprint(len(text), text[-3:])\n"
    wait_until(lambda: len(waiting_sandboxes(host)) >= 1, timeout=20, what="a prepared child")
    result = _run(host, code)
    assert result.status == "succeeded" and result.stdout == "600000 bab\n", result


def test_the_code_finds_the_site_set_up_a_fresh_interpreter_in_a_sandbox_finds(host):
    # The template does site.main() once, inside its shared root (prepare_site), for
    # every child; what the code sees of it must be what a fresh ``python -I`` in a
    # bubblewrap sandbox sees: the same sys.path, site's user directories (from the
    # sandbox's HOME, not the template's), and the builtins site adds.
    code = """
    import builtins, json, site, sys
    added = ("exit", "quit", "help", "copyright", "credits", "license")
    print(json.dumps({
        "path": sys.path,
        "user": [site.ENABLE_USER_SITE, site.USER_BASE, site.USER_SITE],
        "site_dirs": site.getsitepackages(),
        "builtins": {name: type(getattr(builtins, name, None)).__name__ for name in added},
        "exit": repr(exit),
        "home": __import__("os").environ.get("HOME"),
    }))
    """
    wait_until(lambda: len(waiting_sandboxes(host)) >= 1, timeout=20, what="a prepared child")
    from_template = _run(host, code)
    assert from_template.status == "succeeded" and from_template.stderr == "", from_template
    with start_host(TOKEN, extra_args=("--template", "off")) as bwrap_host:
        fresh = _run(bwrap_host, code)
    assert fresh.status == "succeeded" and fresh.stderr == "", fresh
    assert from_template.stdout == fresh.stdout
    seen = json.loads(from_template.stdout)
    assert set(seen["builtins"].values()) != {"NoneType"} and seen["path"], seen


@pytest.mark.parametrize("code_found", [None, "sitecustomize", "pth"])
def test_site_is_left_to_each_child_when_it_would_run_code_found_in_the_root(tmp_path, code_found):
    # prepare_site runs site.main() in the template only when it would run no code found
    # in the sandbox's root: a sitecustomize (here at the standard library's own path,
    # in a root built for the test) or a .pth file in a site-packages directory left
    # unmasked must run in each sandbox, contained, as in a fresh interpreter; never in
    # the template. A child (forked here, chrooted as a sandbox is) runs it then.
    root = tmp_path / "root"
    stdlib = os.path.dirname(os.__file__)
    (root / stdlib.lstrip("/")).mkdir(parents=True)
    if code_found == "sitecustomize":
        (root / stdlib.lstrip("/") / "sitecustomize.py").write_text("print('code found ran')\n")
    probe = textwrap.dedent(
        f"""
        import builtins, importlib.util, json, os, site, sys
        root = {str(root)!r}
        for directory in site.getsitepackages():  # so that site has one to add
            os.makedirs(root + directory, exist_ok=True)
            if {code_found == "pth"!r}:
                with open(root + directory + "/found.pth", "w") as fh:
                    fh.write("import sys; print('code found ran')\\n")
        spec = importlib.util.spec_from_file_location("template", {str(TEMPLATE_SOURCE)!r})
        template = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(template)
        path, cwd, environ = list(sys.path), os.getcwd(), dict(os.environ)
        done = template.prepare_site({{"newroot": root, "env": {{"HOME": "/tmp"}}}})
        print(json.dumps({{"done": done, "path_changed": sys.path != path, "exit": hasattr(builtins, "exit"),
                          "cwd_back": os.getcwd() == cwd, "root_back": os.path.exists({str(TEMPLATE_SOURCE)!r}),
                          "environ_back": dict(os.environ) == environ}}), flush=True)
        pid = os.fork()
        if pid == 0:
            os.chroot(root)
            os.chdir("/")
            template.site_for_child(done)
            print(json.dumps({{"child_exit": hasattr(builtins, "exit"), "child_path": sys.path}}), flush=True)
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        """
    )
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    seen, child = json.loads(lines[0]), json.loads(lines[-1])
    found = code_found is not None
    assert seen["done"] is not found and seen["exit"] is not found and seen["path_changed"] is not found, seen
    assert seen["cwd_back"] and seen["root_back"] and seen["environ_back"], seen
    # Run once, by the child; the template's own line comes before it.
    assert lines.count("code found ran") == (1 if found else 0) and lines[0] != "code found ran", lines
    assert child["child_exit"] and any(p.endswith("site-packages") for p in child["child_path"]), child


def test_under_bubblewrap_the_code_may_still_set_its_own_parent_death_signal():
    # Only a template child is its namespace's init; a job's tools under bubblewrap keep
    # the prctl they may use.
    with start_host(TOKEN, extra_args=("--template", "off")) as bwrap_host:
        code = """
        import ctypes, signal
        print(ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0))
        """
        result = _run(bwrap_host, code)
    assert result.status == "succeeded" and result.stdout == "0\n", result


@pytest.mark.parametrize("reply", [b"not json", b'["pid", 7]', b'{"pid": "seven"}'])
def test_an_unreadable_answer_from_the_template_starts_nothing_and_leaks_no_descriptor(reply):
    """A reply out of the template's protocol (a template out of step): the fork request
    fails as the template being unavailable (the execution moves, nothing ran), and the
    descriptor that came with it is closed. A template on the other end of a socket pair
    in this process, to choose its answer."""
    import socket

    from sandbox_host import isolation, uids
    from sandbox_host.template_host import Template, TemplateUnavailable

    base, lock_fd = uids.claim(1)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        template = Template(isolation.build(isolation.FULL, uid_base=base))
        template._sock = ours

        def answer() -> None:
            _, fds, _, _ = socket.recv_fds(theirs, 4096, 8)
            read, write = os.pipe()
            socket.send_fds(theirs, [reply], [read])
            for fd in (*fds, read, write):
                os.close(fd)

        answering = threading.Thread(target=answer)
        answering.start()
        request_read, request_write = os.pipe()
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(TemplateUnavailable, match=r"unreadable|refused"):
            template.spawn({"uid": base}, [request_read])
        answering.join(timeout=10)
        assert set(os.listdir("/proc/self/fd")) <= before
    finally:
        for fd in (request_read, request_write, lock_fd):
            os.close(fd)
        ours.close()
        theirs.close()
