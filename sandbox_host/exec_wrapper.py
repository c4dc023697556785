"""Exec wrapper: the first program of every sandbox, on the host's side of it. Joins the
sandbox's control groups, applies the rlimits floor, then executes the sandbox itself
(bubblewrap; ``setpriv`` and the interpreter run inside it).

Why a separate program rather than ``preexec_fn``: the host is multi-threaded, and code
run between ``fork`` and ``exec`` in a threaded process can deadlock on a lock another
thread held at fork time. Here the work is done by a single-threaded process, before
anything of the sandbox exists, so everything the sandbox starts is born inside its
groups and under its limits.

Runs as ``python -I exec_wrapper.py SPEC_JSON``. Standard library only. Any failure
exits 126 with one line on stderr and nothing of the sandbox started.
"""

import ctypes
import json
import os
import resource
import signal
import sys

SETUP_FAILED_EXIT = 126
_PR_SET_PDEATHSIG = 1
RLIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "as_bytes": resource.RLIMIT_AS,
    "nproc": resource.RLIMIT_NPROC,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}


def main(argv: list[str]) -> None:
    spec = json.loads(argv[1])
    parent = spec.get("die_with_parent")
    if parent:
        # An execution must not outlive a SIGKILLed host. bwrap's --die-with-parent only
        # covers a parent that dies after bwrap started; this covers the moments before
        # (the signal setting survives the exec into bwrap), and a host already gone.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            raise OSError("the host exited before its sandbox started")
    for procs in spec.get("cgroups", ()):
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    # Hard limits too: lowered here, user code can never raise them again.
    for name, value in spec["rlimits"].items():
        resource.setrlimit(RLIMITS[name], (value, value))
    command = spec["argv"]
    # The environment is the one we were given: empty for an execution, so nothing the
    # host knows (its token above all) reaches the sandbox or even bubblewrap.
    os.execve(command[0], command, dict(os.environ))  # noqa: S606 - exec without a shell is the point


if __name__ == "__main__":
    try:
        main(sys.argv)
    except Exception as exc:  # report, never a traceback that could echo the spec
        sys.stderr.write(f"holdfast: sandbox setup failed: {exc.__class__.__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED_EXIT)
