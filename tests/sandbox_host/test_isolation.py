"""Issue 2, test 4: user code runs in a child that cannot reach the host's token, is
held to its memory, time, process and output limits, cannot leave a process behind,
and (where the isolation provides a network namespace) has no network."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import textwrap
import threading
import uuid

import pytest

from holdfast_wire import protocol
from sandbox_host.sandbox import EXECUTION_ENV
from tests.support.host import (
    SHARED_LEVEL,
    busy_descendants,
    connect,
    descendants,
    execute,
    new_id,
    recv_frame,
    send_frame,
    share,
    start_host,
)
from tests.timing import scaled, wait_until

from .conftest import TOKEN

pytestmark = pytest.mark.peer

# Reads every place a child might find the host's environment and prints what it got.
SNOOP = textwrap.dedent(
    """
    import os
    print("environ", dict(os.environ))
    targets = {"ppid": os.getppid(), "init": 1, "host": HOST_PID}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            targets["pid" + pid] = int(pid)
    for name, pid in targets.items():
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as fh:
                    print(name, part, fh.read())
            except OSError as exc:
                print(name, part, "unreadable", exc.__class__.__name__)
    """
)


@pytest.fixture(scope="module")
def rlimits_host():
    """The weakest isolation (no namespaces): the guards that remain must still hold."""
    with start_host(TOKEN, extra_args=("--isolation", "insecure-rlimits")) as running:
        yield running


@pytest.mark.parametrize("which", ["host", "rlimits_host"])
def test_the_child_cannot_read_the_host_token(which, request):
    host = request.getfixturevalue(which)
    ws = connect(host.url, TOKEN)
    try:
        result = execute(ws, SNOOP.replace("HOST_PID", str(host.pid)))
    finally:
        ws.close()
    assert result.status == "succeeded", result.stderr
    assert "ppid environ" in result.stdout and "init environ" in result.stdout  # it did look
    assert TOKEN not in result.stdout + result.stderr
    assert "HOLDFAST_SANDBOX_TOKEN" not in result.stdout
    environ = eval(result.stdout.splitlines()[0].removeprefix("environ "))  # noqa: S307 - our own repr
    if which == "host":
        # The sandbox's own places, the working directory bubblewrap names and what
        # Python's locale coercion adds itself: nothing of the host's.
        expected = {**EXECUTION_ENV, "PWD": "/tmp", "LC_CTYPE": "C.UTF-8"}
        assert {k: v for k, v in environ.items() if k in expected} == {k: expected[k] for k in environ}
    else:
        assert set(environ) <= {"LC_CTYPE"}


def test_the_host_log_never_carries_the_token(host):
    assert TOKEN not in host.log()


def test_a_memory_hog_gets_memory_error(host):
    ws = connect(host.url, TOKEN)
    try:
        result = execute(ws, "data = bytearray(1024 * 1024 * 1024)\nprint('allocated')", memory_mb=128)
    finally:
        ws.close()
    assert result.status == "failed"
    assert result.exit_code == 1
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


def test_a_busy_loop_is_killed_at_its_timeout(host):
    ws = connect(host.url, TOKEN)
    try:
        result = execute(ws, "while True:\n    pass", timeout_ms=1000)
    finally:
        ws.close()
    assert result.status == "timed_out"
    assert result.error == "Execution timed out after 1000 ms"
    assert result.exit_code is None


def test_user_code_that_raises_fails_with_its_traceback(host):
    ws = connect(host.url, TOKEN)
    try:
        result = execute(ws, "print('before')\nraise ValueError('boom')")
    finally:
        ws.close()
    assert (result.status, result.exit_code, result.error) == ("failed", 1, "")
    assert result.stdout == "before\n"
    assert "Traceback" in result.stderr and "ValueError: boom" in result.stderr


def test_each_execution_gets_its_own_empty_working_dir(host):
    ws = connect(host.url, TOKEN)
    try:
        first = execute(ws, "import os\nopen('f', 'w').write('x')\nprint(os.getcwd())")
        second = execute(ws, "import os\nprint(os.getcwd(), os.listdir('.'))")
    finally:
        ws.close()
    assert first.status == "succeeded", first.stderr
    # The sandbox's own tmpfs: nothing of the first execution is there for the second.
    assert first.stdout.strip() == "/tmp"
    assert (second.status, second.stdout.strip()) == ("succeeded", "/tmp []"), second


def _survivors(host, marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_fork_bomb_is_contained_and_leaves_nothing_behind(host):
    marker = "holdfast-bomb-" + uuid.uuid4().hex
    bomb = textwrap.dedent(
        f"""
        import os, sys
        # Every process re-execs with the marker in its argv, so the test can find survivors.
        if len(sys.argv) < 2:
            os.execv(sys.executable, [sys.executable, "-I", sys.argv[0], {marker!r}])
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """
    )
    bomber = connect(host.url, TOKEN, timeout=scaled(30))
    other = connect(host.url, TOKEN, timeout=scaled(30))
    try:
        bomb_id = new_id()
        send_frame(bomber, protocol.Execute(id=bomb_id, code=bomb, timeout_ms=3000, memory_mb=256))
        assert isinstance(recv_frame(bomber), protocol.Started)
        # While it rages, the host still runs other work.
        during = execute(other, "print('alive')", timeout_ms=20_000)
        assert during.status == "succeeded" and during.stdout == "alive\n"
        result = recv_frame(bomber)
    finally:
        bomber.close()
        other.close()
    assert isinstance(result, protocol.Result) and result.status == "timed_out"
    wait_until(lambda: not _survivors(host, marker), timeout=5, what="fork bomb processes to be gone")
    wait_until(
        lambda: not busy_descendants(host.pid),
        timeout=5,
        what="the host to have no children but its prepared sandboxes",
    )


@pytest.mark.parametrize("which", ["host", "rlimits_host"])
def test_a_setsid_grandchild_does_not_survive_its_execution(which, request):
    """With a PID namespace the kernel kills it with the namespace; without one (as
    root) the sweep of the slot's own uid does."""
    host = request.getfixturevalue(which)
    if host.isolation == "rlimits" and os.geteuid() != 0:
        pytest.skip("without root there is no per-slot uid to sweep and no PID namespace")
    marker = "holdfast-escape-" + uuid.uuid4().hex
    escape = textwrap.dedent(
        f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()  # leaves the process group: only a PID namespace or uid sweep gets it
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
            os._exit(0)
        print("spawned", flush=True)
        time.sleep(60)
        """
    )
    ws = connect(host.url, TOKEN)
    try:
        result = execute(ws, escape, timeout_ms=1500)
    finally:
        ws.close()
    assert result.status == "timed_out" and result.stdout == "spawned\n"
    wait_until(lambda: not _survivors(host, marker), timeout=5, what="the escaped grandchild to be gone")


def test_output_is_capped_with_a_marker(host):
    limit = protocol.MAX_OUTPUT_BYTES
    code = f"import sys\nsys.stdout.write('x' * {limit + 5000})\nsys.stderr.write('y' * {limit * 2})\nprint('done')"
    ws = connect(host.url, TOKEN, timeout=scaled(30))
    try:
        result = execute(ws, code)
    finally:
        ws.close()
    marker = protocol.OUTPUT_TRUNCATED_MARKER.format(limit=limit)
    assert result.status == "succeeded"  # the child was never blocked on a full pipe
    assert result.stdout == "x" * limit + marker
    assert result.stderr == "y" * limit + marker


def test_the_child_has_no_network(host):
    assert host.isolation == "bwrap"  # the default: a host that cannot build it does not start
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    accepted = []

    def accept() -> None:
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    watcher = threading.Thread(target=accept)
    watcher.start()
    port = listener.getsockname()[1]
    ws = connect(host.url, TOKEN)
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
        result = execute(ws, code)
    finally:
        ws.close()
        watcher.join()
        listener.close()
    assert result.status == "failed" and "connected" not in result.stdout
    assert "OSError" in result.stderr or "Error" in result.stderr
    assert not accepted


def test_a_cancel_kills_the_execution_and_answers_cancelled(host):
    ws = connect(host.url, TOKEN)
    try:
        execution_id = new_id()
        send_frame(
            ws, protocol.Execute(id=execution_id, code="import time\ntime.sleep(60)", timeout_ms=60_000, memory_mb=128)
        )
        assert recv_frame(ws) == protocol.Started(id=execution_id)
        send_frame(ws, protocol.Cancel(id=execution_id))
        result = recv_frame(ws)
    finally:
        ws.close()
    assert isinstance(result, protocol.Result)
    assert (result.id, result.status) == (execution_id, "cancelled")


def test_a_second_execute_with_a_running_id_is_refused(host):
    ws = connect(host.url, TOKEN)
    try:
        execution_id = new_id()
        frame = protocol.Execute(
            id=execution_id, code="import time\ntime.sleep(1)\nprint('once')", timeout_ms=10_000, memory_mb=128
        )
        send_frame(ws, frame)
        assert recv_frame(ws) == protocol.Started(id=execution_id)
        send_frame(ws, frame)
        refusal = recv_frame(ws)
        result = recv_frame(ws)
    finally:
        ws.close()
    assert isinstance(refusal, protocol.Error) and (refusal.code, refusal.id) == ("duplicate_id", execution_id)
    assert isinstance(result, protocol.Result) and result.stdout == "once\n"


def test_beyond_the_admission_limit_the_answer_is_not_started_at_capacity():
    with start_host(TOKEN, extra_args=("--max-concurrent", "1")) as host:
        ws = connect(host.url, TOKEN)
        try:
            first = new_id()
            send_frame(
                ws, protocol.Execute(id=first, code="import time\ntime.sleep(1)", timeout_ms=10_000, memory_mb=128)
            )
            assert recv_frame(ws) == protocol.Started(id=first)
            second = new_id()
            refused = execute(ws, "print('never')", id=second)
            assert refused == protocol.NotStarted(id=second, reason="at_capacity")
            assert isinstance(recv_frame(ws), protocol.Result)
            # The slot is free again.
            assert execute(ws, "print('now')").stdout == "now\n"
        finally:
            ws.close()


def test_an_execution_does_not_outlive_a_sigkilled_host():
    """The host dies without a chance to clean up: its children must die with it."""
    with start_host(TOKEN) as host:
        ws = connect(host.url, TOKEN)
        execution = new_id()
        send_frame(
            ws, protocol.Execute(id=execution, code="import time\ntime.sleep(60)\n", timeout_ms=60_000, memory_mb=128)
        )
        assert recv_frame(ws) == protocol.Started(id=execution)
        children = descendants(host.pid)
        assert children, "the execution has no process to begin with"
        os.kill(host.pid, signal.SIGKILL)  # only the host: not its descendants
        host.popen.wait(timeout=scaled(10))
        ws.close()
        try:
            wait_until(
                lambda: not _alive(children), timeout=10, what=f"the orphaned children to die: {_described(children)}"
            )
        finally:
            for pid in _alive(children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _described(pids: list[int]) -> list[str]:
    found = []
    for pid in _alive(pids):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            found.append(f"{pid}: {fh.read()[:80]!r}")
    return found


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            continue
    return alive


def test_auth_ok_tells_the_isolation_level_and_the_bounds(host):
    ws = connect(host.url, TOKEN)
    ws.close()
    assert ws.auth_ok.isolation == "bwrap"
    bounds = ws.auth_ok.bounds
    assert bounds["memory"].startswith("cgroup") and bounds["processes"] == bounds["memory"]
    assert bounds["scratch_bytes"] == 64 * 1024 * 1024 and bounds["seccomp"] is True
    assert "warning" not in bounds


def test_the_next_execution_in_a_slot_is_not_touched_by_the_last_ones_cleanup():
    """Control groups are named after the slot's uid: a late second cleanup of an
    execution whose slot already runs the next one must not remove (kill) that one.
    Real children in this process, to force the interleaving."""
    from sandbox_host import isolation, uids
    from sandbox_host.children import Child, Limits

    base, lock_fd = uids.claim(1)
    try:
        contained = isolation.build(isolation.FULL, uid_base=base)
        limits = Limits(timeout_ms=20_000, memory_mb=256)
        first = Child("print('first')", limits, isolation=contained, uid=base)
        first.start()
        assert first.wait().stdout == "first\n"
        first.cleanup()
        second = Child("import time\ntime.sleep(1)\nprint('second')", limits, isolation=contained, uid=base)
        second.start()
        first.cleanup()  # late, as the first execution's thread does after its result
        outcome = second.wait()
        second.cleanup()
    finally:
        os.close(lock_fd)
    assert (outcome.status, outcome.stdout) == ("succeeded", "second\n")


def test_a_host_with_a_shared_dir_reports_a_level_below_the_full_sandbox(tmp_path):
    """--insecure-shared-dir lets every tenant read and write one host directory: the
    host must not call that the full sandbox, so a strict pool refuses it."""
    with start_host(TOKEN, extra_args=share(tmp_path)) as shared:
        ws = connect(shared.url, TOKEN)
        ws.close()
    assert ws.auth_ok.isolation == SHARED_LEVEL
    assert ws.auth_ok.bounds["insecure_shared_dir"] == str(tmp_path) and "warning" in ws.auth_ok.bounds
    assert protocol.isolation_refusal(ws.auth_ok.isolation, protocol.FULL_ISOLATION)
