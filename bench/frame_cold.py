"""What the host's handling of one execute frame costs warm and after a pause: the
WebSocket layer reading it, the wire's session decoding it, and the ``started`` frame
encoded and framed back; in this process, no socket, no thread, no child. Run back to
back, and 100 ms apart (an execution now and then) in three ways: asleep, spinning on
the clock (the CPU never idle), and spinning while writing across 64 MiB. If the pause
costs as much spinning as asleep, it is not the CPU waking from idle (what it is
instead, this does not measure; docs/benchmarks.md, eleventh session). ``--hand`` adds
the same rows with the frame read and the ``started`` frame built by a few lines of
struct and websockets' own mask routine instead of its protocol object, each sample
alternated with one through websockets: at most what our own framing after auth could
save, since these lines check nothing a parser must (twelfth session). One command:

    .venv/bin/python bench/frame_cold.py [--n 40] [--hand]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.server import ServerProtocol
from websockets.speedups import apply_mask
from websockets.uri import parse_uri

from bench.host_speed import execute_frame
from holdfast_wire import protocol, server

TOKEN = "frame-cold-" + "x" * 32
STEPS = ("the frame read", "decoded (the wire's session)", "started encoded and framed")


def opened() -> tuple[ServerProtocol, server.ServerSession]:
    """A server-side WebSocket past its handshake and a session past its auth, as a
    host's connection has them when executions arrive."""
    ws = ServerProtocol(max_size=protocol.MAX_FRAME_BYTES)
    client = ClientProtocol(parse_uri("ws://bench/"))
    client.send_request(client.connect())
    ws.receive_data(b"".join(client.data_to_send()))
    ws.send_response(ws.accept(ws.events_received()[0]))
    ws.data_to_send()
    session = server.ServerSession(token=TOKEN)
    session.receive(protocol.encode(protocol.Auth(token=TOKEN, client="bench")))
    session.data_to_send()
    return ws, session


def hand_read(data: bytes) -> bytes:
    """The payload of one whole masked frame, trusted to be one (a measure, not a parser)."""
    size, at = data[1] & 0x7F, 2
    if size == 126:
        size, at = struct.unpack_from("!H", data, 2)[0], 4
    elif size == 127:
        size, at = struct.unpack_from("!Q", data, 2)[0], 10
    return apply_mask(data[at + 4 : at + 4 + size], data[at : at + 4])


def hand_frame(text: bytes) -> bytes:
    """A server's unmasked final text frame."""
    size = len(text)
    if size < 126:
        return bytes((0x81, size)) + text
    if size < 65536:
        return struct.pack("!BBH", 0x81, 126, size) + text
    return struct.pack("!BBQ", 0x81, 127, size) + text


def one(
    ws: ServerProtocol, session: server.ServerSession, pause: Callable[[], None], hand: bool = False
) -> tuple[float, ...]:
    """Each step's seconds for one execute frame arriving after ``pause()``."""
    execution_id = uuid.uuid4().hex
    data = Frame(Opcode.TEXT, execute_frame(execution_id, "print(1)").encode()).serialize(mask=True, extensions=[])
    pause()
    t0 = time.perf_counter()
    if hand:
        message = hand_read(data)
    else:
        ws.receive_data(data)
        (event,) = ws.events_received()
        message = event.data
    t1 = time.perf_counter()
    session.receive(message)
    t2 = time.perf_counter()
    session.send(protocol.Started(id=execution_id))
    for text in session.data_to_send():
        if hand:
            hand_frame(text.encode())
        else:
            ws.send_text(text.encode())
    if not hand:
        ws.data_to_send()
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def spin(seconds: float, memory: bytearray | None = None) -> None:
    deadline = time.perf_counter() + seconds
    at = 0
    while time.perf_counter() < deadline:
        if memory is not None:
            memory[at % len(memory)] = 1
            at += 7 * 4096 + 64  # a new page and cache line each time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--hand", action="store_true", help="add rows framed by hand")
    args = parser.parse_args()
    ws, session = opened()
    memory = bytearray(64 << 20)
    ways: dict[str, Callable[[], None]] = {
        "back to back": lambda: None,
        "100 ms apart, asleep": lambda: time.sleep(0.1),
        "100 ms apart, spinning": lambda: spin(0.1),
        "100 ms apart, spinning over 64 MiB": lambda: spin(0.1, memory),
    }
    print(f"{'p50 us, n=' + str(args.n):<46}" + "".join(f"{step:>30}" for step in STEPS))
    kinds = (False, True) if args.hand else (False,)
    rows: dict[str, str] = {}
    for name, pause in ways.items():
        samples: dict[bool, list] = {hand: [] for hand in kinds}
        for _ in range(args.n + 5):
            for hand in kinds:  # alternated, so both meet the machine in the same state
                samples[hand].append(one(ws, session, pause, hand))
        for hand in kinds:
            columns = zip(*samples[hand][5:], strict=True)
            label = f"{name}, {'by hand' if hand else 'websockets'}"
            rows[label] = "".join(f"{statistics.median(column) * 1e6:>30.1f}" for column in columns)
    for label in sorted(rows, key=lambda label: label.endswith("by hand")):
        print(f"{label:<46}{rows[label]}")


if __name__ == "__main__":
    main()
