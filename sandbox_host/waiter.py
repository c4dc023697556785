"""The first and only program of a prepared sandbox: an interpreter already started,
contained and unprivileged, waiting for one execution's code.

A host keeps a few sandboxes prepared ahead of time (``reserve.py``): bubblewrap has
built each one's private root and namespaces, ``setpriv`` has dropped it to its slot's
uid with no capabilities and no_new_privs, the seccomp filter is loaded, and this
program is blocked reading an inherited pipe. The host writes one header line (the
execution's rlimits and the code's length) and the code, and keeps its end open until
the sandbox has ended: what is still unread in the pipe then tells whether a sandbox
that died (killed from outside the moment it was taken) had read its code, so an
execution whose code provably never ran is given another sandbox (``children.py``,
``Child.died_unread``). This program reads exactly that much, lowers its
limits to the execution's, compiles the code (here, in the sandbox, never before) and
runs it as ``__main__`` the way ``python -I /holdfast/main.py`` would: same module
name, ``__file__``, ``sys.argv``, tracebacks (without this program's frame) and exit
codes. It is used once: the sandbox ends with the code.

It ends the way interpreter shutdown ends as far as anyone can see (non-daemon threads
joined, ``atexit`` handlers run, stdout and stderr flushed), then exits at once instead
of tearing every module down: the sandbox, its tmpfs included, is thrown away whole, so
the milliseconds of finalisation would buy nothing but a later result.

Its exit status also goes down a second pipe, written once stdout and stderr are
flushed: the host reports the result then, instead of when bubblewrap has torn the
sandbox down (a millisecond or more later), and kills what is left afterwards. The code
can write to that pipe too (it is this process's fd), which only lets it end its own
execution early and lie about its own result, as printing and exiting can: the host
takes nothing there but a status from 0 to 255 (``children._exit_status``). The fd is
not inherited by its children.

Runs as ``python -I /holdfast/waiter.py CODE_FD STATUS_FD``. Standard library only. A
pipe closed with nothing in it (the host let the sandbox go unused) exits 0 without
running anything.
"""

import atexit
import builtins
import contextlib
import io
import linecache
import os
import resource
import sys
import traceback
import types
from importlib.machinery import SourceFileLoader

FILENAME = "/holdfast/main.py"


def header(as_bytes: int, cpu_s: int, size: int) -> bytes:
    """The line before the code: the execution's address-space and CPU limits and the
    code's length in bytes (integers, not JSON: parsed with no Python call once the
    code is in)."""
    return b"%d %d %d\n" % (as_bytes, cpu_s, size)


def read_payload(fd: int) -> tuple[bytes, bytes]:
    """The header line and the code, read to the length the header gives (the host's
    end stays open, so no end of file marks it), then ``fd`` closed. Empty for a pipe
    closed with nothing in it: the host let this sandbox go unused."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    line, _, code = data.partition(b"\n")
    if line:
        chunks, size, got = [code], int(line.split()[2]), len(code)
        while got < size and (chunk := os.read(fd, min(size - got, 1 << 20))):
            chunks.append(chunk)
            got += len(chunk)
        if got < size:
            os._exit(1)  # the host died writing it: never run part of the code
        code = b"".join(chunks)
    os.close(fd)
    return line, code


_status_fd = -1


def main(argv: list[str]) -> None:
    serve(int(argv[1]), int(argv[2]) if len(argv) > 2 else -1)


def serve(code_fd: int, status_fd: int, arrived: types.FunctionType | None = None) -> None:
    """Wait for the code on ``code_fd``, then run it (the warm template's children call
    this too, with ``arrived`` run once the code is in)."""
    global _status_fd
    # Nothing of this depends on the code: done while the sandbox waits, it is not done
    # after the code arrives, when each step is slow (docs/benchmarks.md, ninth session).
    module = main_module()
    if status_fd >= 0:
        _status_fd = status_fd
        os.set_inheritable(_status_fd, False)
    line, code = read_payload(code_fd)
    if not line:
        os._exit(0)
    if arrived is not None:
        arrived()
    as_bytes, cpu_s, _ = map(int, line.split())
    # Lowering only: the sandbox was started with the reserve's ceilings, and an
    # unprivileged process can never raise a hard limit again.
    resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    run(code.decode("utf-8", errors="surrogateescape"), module)


def rehearse() -> None:
    """Walk the path an execution takes, on a constant, while the sandbox waits for its
    code. A template's child shares the template's memory until it writes to it, and the
    first write to a page copies it (a page fault): made now, those copies are not made
    while the code runs (``bench/child_faults.py``: 42 faults during ``print(1)``, 14
    after). Runs contained as the code will, and leaves nothing the code could see: no
    module, no cache entry, no output. A step that fails costs only its copies."""
    with contextlib.suppress(Exception):
        namespace = {"__builtins__": builtins, "sink": io.StringIO()}
        exec(compile("print(1, file=sink)\n", FILENAME, "exec"), namespace)  # noqa: S102 - a constant
        del namespace
    with contextlib.suppress(Exception):
        "1\n".splitlines(True)
        for stream in (sys.stdout, sys.stderr):
            stream.write("")
            stream.flush()
    with contextlib.suppress(Exception):
        for number in (resource.RLIMIT_AS, resource.RLIMIT_CPU):
            resource.setrlimit(number, resource.getrlimit(number))  # unchanged


def main_module() -> types.ModuleType:
    """The code's ``__main__``: what the interpreter gives a script's, its loader reading
    the file the host wrote, for tracebacks and inspect (sandbox.py mounts it at
    FILENAME). In ``sys.modules`` and ``sys.argv`` already."""
    module = types.ModuleType("__main__")
    module.__file__ = FILENAME
    module.__cached__ = None
    if sys.version_info < (3, 14):  # from 3.14 annotations are built on demand (PEP 649)
        module.__annotations__ = {}
    module.__loader__ = SourceFileLoader("__main__", FILENAME)
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [FILENAME]
    # An entry for run() to replace: the dict's copy is made now, not then.
    linecache.cache[FILENAME] = (0, None, [], FILENAME)
    return module


def run(source: str, module: types.ModuleType) -> None:
    # Tracebacks read the source through linecache, as they would from the file.
    linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
    try:
        exec(compile(source, FILENAME, "exec"), module.__dict__)  # noqa: S102 - running user code is the point
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException as exc:
        # As the interpreter reports an uncaught exception, minus this program's frame.
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    else:
        code = 0
    finish(code)


def exit_code(exc: SystemExit) -> int:
    """What the interpreter exits with for ``SystemExit(exc.code)``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def finish(code: int) -> None:
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(Exception):
            threading._shutdown()  # joins non-daemon threads, as shutdown does
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if _status_fd >= 0:
        with contextlib.suppress(OSError):
            os.write(_status_fd, b"%d\n" % code)
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv)
