"""Pre-auth flood: does a host stay bounded and keep serving authenticated work while
1,000 connections stream junk before authenticating?

    .venv/bin/python bench/pre_auth_flood.py [--connections 1000] [--n 200]

Starts a sandbox host with its default caps, authenticates one client and measures an
execution's latency idle (the baseline), then again while ``--connections`` sockets,
spread over 40 loopback source addresses, keep streaming junk (each reconnects as soon
as the host closes it). Reports the host's RSS growth and thread peak, how many
connections it refused, and p50/p99 idle vs flooded, in the same run. Exits 1 if RSS
grows more than 64 MiB or the flooded p99 is more than twice the idle one.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import secrets
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import websocket  # noqa: E402

from holdfast_wire import protocol  # noqa: E402

JUNK = b"GET / HTTP/1.1\r\nX-Junk: " + b"j" * 1000 + b"\r\n"
SOURCES = [f"127.0.0.{i}" for i in range(2, 42)]
RSS_LIMIT_KIB = 64 * 1024


def proc_field(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith(name + ":")).split()[1])


def start_host(token: str) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "HOLDFAST_SANDBOX_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    popen = subprocess.Popen(
        [sys.executable, "-m", "sandbox_host", "--listen", "127.0.0.1:0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert popen.stdout is not None
    for line in popen.stdout:
        found = re.search(r"listening ws://127\.0\.0\.1:(\d+) ", line)
        if found:
            return popen, int(found.group(1))
    raise SystemExit("host did not start")


def latencies(ws: websocket.WebSocket, n: int) -> list[float]:
    samples = []
    for i in range(n):
        started = time.perf_counter()
        frame = protocol.Execute(id=f"b{i}x{secrets.token_hex(4)}", code="pass", timeout_ms=10_000, memory_mb=256)
        ws.send(protocol.encode(frame))
        while not isinstance(frame := protocol.decode(ws.recv()), protocol.Result):
            pass
        assert frame.status == "succeeded", frame
        samples.append(time.perf_counter() - started)
    return samples


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


class Flood:
    """Keeps ``count`` non-blocking sockets connected to the host, writing junk."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.sel = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.connects = 0
        self.closed_by_host = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self, index: int) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((SOURCES[index % len(SOURCES)], 0))
        err = sock.connect_ex(("127.0.0.1", self.port))
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            return
        self.connects += 1
        self.sel.register(sock, selectors.EVENT_WRITE | selectors.EVENT_READ, index)

    def run(self) -> None:
        for i in range(self.count):
            self.open_one(i)
        while not self.stop.is_set():
            for key, events in self.sel.select(timeout=0.1):
                sock, index = key.fileobj, key.data
                try:
                    if events & selectors.EVENT_READ and sock.recv(65536) == b"":
                        raise ConnectionResetError
                    if events & selectors.EVENT_WRITE:
                        sock.send(JUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    self.sel.unregister(sock)
                    sock.close()
                    self.closed_by_host += 1
                    self.open_one(index)
            time.sleep(0.005)  # junk at a steady pace, not a busy loop on our own core
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    token = secrets.token_urlsafe(32)
    host, port = start_host(token)
    try:
        ws = websocket.create_connection(f"ws://127.0.0.1:{port}", timeout=30)
        ws.send(protocol.encode(protocol.Auth(token=token, client="bench")))
        assert isinstance(protocol.decode(ws.recv()), protocol.AuthOk)
        latencies(ws, 20)  # warm up
        idle = latencies(ws, args.n)
        rss_idle = proc_field(host.pid, "VmRSS")
        threads_idle = proc_field(host.pid, "Threads")
        flood = Flood(port, args.connections)
        flood.thread.start()
        time.sleep(3)  # the flood at full strength before measuring
        peak_rss, peak_threads = rss_idle, threads_idle
        done = threading.Event()

        def sample() -> None:
            nonlocal peak_rss, peak_threads
            while not done.is_set():
                peak_rss = max(peak_rss, proc_field(host.pid, "VmRSS"))
                peak_threads = max(peak_threads, proc_field(host.pid, "Threads"))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        flooded = latencies(ws, args.n)
        done.set()
        sampler.join()
        flood.stop.set()
        flood.thread.join()
        ws.close()
    finally:
        host.terminate()
        host.wait(30)
    growth_kib = peak_rss - rss_idle
    print(f"pre-auth flood: {args.connections} junk connections from {len(SOURCES)} addresses, n={args.n}")
    print(f"  connects attempted {flood.connects}, closed or refused by the host {flood.closed_by_host}")
    mib = 1024
    print(f"  host RSS idle {rss_idle / mib:.1f} MiB, peak {peak_rss / mib:.1f} MiB: growth {growth_kib / mib:.1f} MiB")
    print(f"  host threads idle {threads_idle}, peak {peak_threads}")
    for label, samples in (("idle   ", idle), ("flooded", flooded)):
        p50 = statistics.median(samples) * 1000
        print(f"  execution latency {label} p50 {p50:.1f} ms  p99 {pct(samples, 0.99):.1f} ms")
    ok = growth_kib <= RSS_LIMIT_KIB and pct(flooded, 0.99) <= 2 * pct(idle, 0.99)
    print("  verdict: " + ("within bounds (RSS growth <= 64 MiB, p99 <= 2x idle)" if ok else "OUT OF BOUNDS"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
