"""Exec wrapper: the first program of every child. Applies rlimits, drops to the
execution's unprivileged uid, enters its temp dir, then execs the interpreter.

Why a separate program rather than ``preexec_fn``: the host is multi-threaded, and code
run between ``fork`` and ``exec`` in a threaded process can deadlock on a lock another
thread held at fork time. Here the limits are applied by a single-threaded process.

Runs as ``python -I exec_wrapper.py SPEC_JSON`` inside the isolation (namespace or
bubblewrap). Standard library only; imports nothing from ``sandbox_host`` because ``-I``
keeps the package off ``sys.path``. Any failure exits 126 with one line on stderr.
"""

import json
import os
import resource
import sys

SETUP_FAILED_EXIT = 126


def _limit(which: int, value: int) -> None:
    resource.setrlimit(which, (value, value))


def main(argv: list[str]) -> None:
    spec = json.loads(argv[1])
    # Limits first, while still privileged: a lowered hard limit cannot be raised again
    # by the unprivileged user code that follows.
    _limit(resource.RLIMIT_CPU, spec["cpu_s"])
    _limit(resource.RLIMIT_AS, spec["as_bytes"])
    _limit(resource.RLIMIT_NPROC, spec["nproc"])
    _limit(resource.RLIMIT_FSIZE, spec["fsize"])
    _limit(resource.RLIMIT_NOFILE, spec["nofile"])
    _limit(resource.RLIMIT_CORE, 0)
    uid = spec.get("uid")
    if uid is not None:
        # Order matters: groups and gid can only be changed while still root.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            raise OSError("privileges were not dropped")
    os.chdir(spec["cwd"])
    argv_out = spec["argv"]
    # An empty environment: nothing the host knows (its token above all) reaches user code.
    # A run's sandbox names the variables it keeps (its id, key and the control plane's
    # URL, which the host put in our environment, never in argv where ``ps`` shows them).
    env = {name: os.environ[name] for name in spec.get("env_names", ()) if name in os.environ}
    os.execve(argv_out[0], argv_out, env)  # noqa: S606 - exec without a shell is the point


if __name__ == "__main__":
    try:
        main(sys.argv)
    except Exception as exc:  # report, never a traceback that could echo the spec
        sys.stderr.write(f"holdfast: sandbox setup failed: {exc.__class__.__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED_EXIT)
