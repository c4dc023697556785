"""Host-side speed: a trivial execution measured from frame in to result frame out on a
real host's WebSocket (no pool, no database), against a bare spawn of the interpreter
the sandboxes run, in the same run (issue 12: P1 latency, P3 throughput, memory).

Used by ``bench/run.py``; standard library and the wire codec only.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import websocket

from holdfast_wire import protocol
from sandbox_host.sandbox import base_interpreter

SNIPPET = "print(1)"


def bare_spawn() -> None:
    """One ``python -I -c 'print(1)'`` of the interpreter user code runs in, as installed:
    its start also runs every ``.pth`` file in its site-packages."""
    subprocess.run([base_interpreter()[0], "-I", "-c", SNIPPET], check=True, capture_output=True)


_clean: tempfile.TemporaryDirectory | None = None


def clean_interpreter() -> str:
    """The same interpreter (binary and standard library) with an empty site-packages,
    as a sandbox runs it (``sandbox.py`` masks site-packages): a virtualenv made without
    pip. The baseline the host side is judged against. The interpreter as installed can
    start much slower than this: a ``.pth`` file runs at every start, and one that
    imports a package (this workplace's machines carry one importing ``certifi``) costs
    tens of milliseconds that no sandbox pays."""
    global _clean
    if _clean is None:
        _clean = tempfile.TemporaryDirectory(prefix="holdfast-bench-python-")
        subprocess.run([base_interpreter()[0], "-m", "venv", "--without-pip", _clean.name], check=True)
    return str(Path(_clean.name) / "bin" / "python")


def clean_spawn() -> None:
    """One ``python -I -c 'print(1)'`` of ``clean_interpreter()``."""
    subprocess.run([clean_interpreter(), "-I", "-c", SNIPPET], check=True, capture_output=True)


class HostClient:
    """One authenticated connection; ``execute`` sends a frame and waits for its result."""

    def __init__(self, url: str, token: str) -> None:
        self.ws = websocket.create_connection(url, timeout=30)
        self.ws.send(protocol.encode(protocol.Auth(token=token, client="bench")))
        reply = protocol.decode(self.ws.recv())
        if not isinstance(reply, protocol.AuthOk):
            raise SystemExit(f"bench: the host refused us: {reply}")

    def execute(self, code: str = SNIPPET) -> None:
        execution_id = uuid.uuid4().hex
        self.ws.send(protocol.encode(protocol.Execute(id=execution_id, code=code, timeout_ms=10_000, memory_mb=256)))
        while True:
            frame = protocol.decode(self.ws.recv())
            if isinstance(frame, protocol.Result) and frame.id == execution_id:
                if frame.status != "succeeded":
                    raise SystemExit(f"bench: execution failed: {frame}")
                return
            if isinstance(frame, protocol.NotStarted | protocol.Error):
                raise SystemExit(f"bench: execution refused: {frame}")

    def close(self) -> None:
        self.ws.close()


def latencies(fn: Callable[[], None], n: int, *, pause_s: float = 0.0) -> list[float]:
    """``n`` timed calls of ``fn``, one at a time (``pause_s`` between them: a trivial
    execution arriving now and then, not back to back)."""
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
        time.sleep(pause_s)
    return samples


def wake_round_trips(n: int, *, pause_s: float) -> list[float]:
    """``n`` one-byte round trips between this process and a child over two pipes, each
    after ``pause_s`` of sleep: what waking an idle CPU costs on this machine (on a VM
    whose idle CPUs halt, far more after a long idle than a short one). Every hop of an
    execution (client, host, sandbox and back) pays it; a bare spawn, busy throughout,
    does not."""
    child_reads, parent_writes = os.pipe()
    parent_reads, child_writes = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(parent_writes)
        os.close(parent_reads)
        while os.read(child_reads, 1):
            os.write(child_writes, b"x")
        os._exit(0)
    os.close(child_reads)
    os.close(child_writes)
    samples = []
    try:
        for _ in range(n):
            time.sleep(pause_s)
            started = time.perf_counter()
            os.write(parent_writes, b"x")
            os.read(parent_reads, 1)
            samples.append(time.perf_counter() - started)
    finally:
        os.close(parent_writes)
        os.close(parent_reads)
        os.waitpid(pid, 0)
    return samples


def throughput(make: Callable[[], Callable[[], None]], concurrency: int, seconds: float) -> float:
    """Calls per second of ``concurrency`` threads each calling its own ``make()``
    function back to back for ``seconds``."""
    done = [0] * concurrency
    deadline = time.monotonic() + seconds

    def worker(i: int) -> None:
        fn = make()
        while time.monotonic() < deadline:
            fn()
            done[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - started)


def pss_kib(pids: list[int]) -> int:
    """Proportional set size of ``pids`` together, in KiB (shared pages split)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total
