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
from websocket import ABNF

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
    """One authenticated connection. ``execute`` sends a frame and waits for its result
    (the client's round trip); ``exchange`` and ``host_side`` time one execution as P1
    defines it, host side, frame in to result frame out."""

    def __init__(self, url: str, token: str) -> None:
        self.ws = websocket.create_connection(url, timeout=30)
        self.ws.send(protocol.encode(protocol.Auth(token=token, client="bench")))
        reply = protocol.decode(self.ws.recv())
        if not isinstance(reply, protocol.AuthOk):
            raise SystemExit(f"bench: the host refused us: {reply}")

    def execute(self, code: str = SNIPPET) -> None:
        execution_id = uuid.uuid4().hex
        self.ws.send(execute_frame(execution_id, code))
        while True:
            frame = protocol.decode(self.ws.recv())
            if isinstance(frame, protocol.Result) and frame.id == execution_id:
                if frame.status != "succeeded":
                    raise SystemExit(f"bench: execution failed: {frame}")
                return
            if isinstance(frame, protocol.NotStarted | protocol.Error):
                raise SystemExit(f"bench: execution refused: {frame}")

    def host_side(self, code: str = SNIPPET) -> float:
        """One execution timed as P1 defines it, host side, frame in to result frame out,
        in seconds (``exchange``)."""
        sent, received = self.exchange(code)
        return received - sent

    def exchange(self, code: str = SNIPPET, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
        """One execution: when its frame's first byte was written and when the result
        frame's last byte was read back, on ``clock``. Building the frame (its id, JSON,
        WebSocket framing and mask) comes before the first, decoding the result after
        the second: that is this client's work, not the host's. The wake of this client
        when the result arrives, and its reading the ``started`` frame meanwhile, are
        between. Reads the socket itself, beside websocket-client, so it checks that
        neither holds bytes of the other's."""
        if getattr(getattr(self.ws, "frame_buffer", None), "recv_buffer", None):
            raise SystemExit("bench: websocket-client holds unread bytes; the socket cannot be read beside it")
        execution_id = uuid.uuid4().hex
        data = ABNF.create_frame(execute_frame(execution_id, code), ABNF.OPCODE_TEXT).format()
        sock, frames = self.ws.sock, ServerFrames()
        sent = clock()
        sock.sendall(data)
        while True:
            chunk = sock.recv(1 << 16)
            received = clock()
            if not chunk:
                raise SystemExit("bench: the host closed the connection")
            messages = frames.feed(chunk)
            for i, message in enumerate(messages):
                frame = protocol.decode(message)
                if isinstance(frame, protocol.Result) and frame.id == execution_id:
                    if frame.status != "succeeded":
                        raise SystemExit(f"bench: execution failed: {frame}")
                    if frames.buffer or i != len(messages) - 1:
                        raise SystemExit("bench: the host sent more after the result; it would be lost here")
                    return sent, received
                if isinstance(frame, protocol.NotStarted | protocol.Error):
                    raise SystemExit(f"bench: execution refused: {frame}")

    def close(self) -> None:
        self.ws.close()


def execute_frame(execution_id: str, code: str) -> str:
    """The execute frame every host-side row sends: limits well above what a trivial
    snippet needs, the same for every row."""
    return protocol.encode(protocol.Execute(id=execution_id, code=code, timeout_ms=10_000, memory_mb=256))


class ServerFrames:
    """The text messages in a host's WebSocket byte stream, fed as it is read (RFC 6455:
    a server's frames are unmasked; the host sends each message as one frame).
    ``websocket-client`` reads frames itself, but it cannot say when the bytes of one
    arrived. Anything but a whole text frame is a surprise here, and stops the bench at
    its first two bytes (a misread length would otherwise wait for bytes never sent)."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self.buffer += chunk
        messages = []
        while len(self.buffer) >= 2:
            first, second = self.buffer[0], self.buffer[1]
            if first != 0x80 | ABNF.OPCODE_TEXT or second & 0x80:
                raise SystemExit(f"bench: the host sent a frame this bench does not expect ({first:#x})")
            length = second & 0x7F
            at = {126: 4, 127: 10}.get(length, 2)  # a 16- or 64-bit length follows
            if at > 2:
                length = int.from_bytes(self.buffer[2:at], "big")  # short: the next check waits
            if len(self.buffer) < at + length:
                break
            messages.append(self.buffer[at : at + length])
            self.buffer = self.buffer[at + length :]
        return messages


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


def host_side_latencies(client: HostClient, n: int, *, pause_s: float = 0.0) -> list[float]:
    """``n`` executions timed by ``client.host_side``, one at a time, ``pause_s`` apart."""
    samples = []
    for _ in range(n):
        samples.append(client.host_side())
        time.sleep(pause_s)
    return samples


def both_latencies(client: HostClient, n: int, *, pause_s: float) -> tuple[list[float], list[float]]:
    """``n`` executions timed host side and ``n`` timed as the client's round trip,
    alternated one for one, ``pause_s`` apart: the two rows see the same machine."""
    inside, round_trips = [], []
    for _ in range(n):
        inside.append(client.host_side())
        time.sleep(pause_s)
        started = time.perf_counter()
        client.execute()
        round_trips.append(time.perf_counter() - started)
        time.sleep(pause_s)
    return inside, round_trips


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
