"""The runner's steer poll: act on each message, then acknowledge exactly what landed.

Protocol (docs/runner-api.md, "steer"): ``GET steer?ack=ID,...&undeliverable=ID,...``
answers ``{"messages": [{"id", "kind", "body"}], "next_poll_s": N}``. The server marks
delivered only the ids a poll acknowledges, so a response lost on the wire is served
again; ``handled`` keeps a re-served message from being applied twice in this runner.

- interrupt: SIGINT to the job's process group (the job decides; only a cancel kills).
  Never given up on: it is retried for the life of the run.
- steer: one JSON line on the job's stdin. A steer that fails
  ``CONTROL_MESSAGE_MAX_ATTEMPTS`` times is dropped with one ``steer_undeliverable``
  event and reported ``undeliverable``, so it cannot stay the oldest pending row forever.
- Each message is handled on its own: one that fails never holds the others back.
- A failed poll is survived; once a poll succeeds again, one ``steer_poll_degraded``
  event gives the degraded window. The loop ends when the run is terminal (409) or the
  job has exited.
- A served batch that yields no new acknowledgement backs off 1 s doubling to 15 s with
  equal jitter, so an unappliable message cannot spin the poll against the control plane.
"""

from __future__ import annotations

import collections
import datetime
import errno
import fcntl
import json
import os
import random as _random
import signal
import threading
from collections.abc import Callable
from typing import Any, Protocol

from runner import backoff
from runner.transport import RunTerminal, TransportError

# Limits
# Attempts before a steer is given up (the seed's CONTROL_MESSAGE_MAX_ATTEMPTS): a job that
# closed its stdin will not reopen it, and three tries ride out a momentarily full pipe.
CONTROL_MESSAGE_MAX_ATTEMPTS = 3
# Ids one poll acknowledges (the server's RUNS_STEER_ACK_MAX); the rest wait one poll.
STEER_ACK_MAX = 32
# Ids remembered as handled, so a re-served message is acknowledged, not re-applied.
HANDLED_MEMORY = 4096

# Timeouts
# Backoff after a served batch that yields no new acknowledgement, or a failed poll:
# 1 s doubling to 15 s, equal jitter (the seed's numbers).
NO_PROGRESS_BACKOFF_BASE_S = 1.0
NO_PROGRESS_BACKOFF_MAX_S = 15.0
# The most an empty answer's next_poll_s can make us idle: an interrupt must land soon.
MAX_IDLE_S = 15.0


class Actor(Protocol):
    def interrupt(self) -> None: ...
    def steer(self, message_id: str, line: bytes) -> None: ...


class Poller(Protocol):
    def call(self, method: str, endpoint: str, *, query: Any = None) -> Any: ...


def steer_line(message: dict[str, Any]) -> bytes:
    return json.dumps({"id": message["id"], "kind": "steer", "body": message.get("body", "")}).encode() + b"\n"


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class SteerLoop:
    def __init__(
        self,
        client: Poller,
        actor: Actor,
        emit: Callable[[str, dict[str, Any]], None],
        *,
        stop: threading.Event | None = None,
        sleep: Callable[[float], None] | None = None,
        random: Callable[[], float] = _random.random,
        now: Callable[[], str] = _now_iso,
    ) -> None:
        self._client = client
        self._actor = actor
        self._emit = emit
        self.stop = stop or threading.Event()
        self._sleep = sleep or self.stop.wait
        self._random = random
        self._now = now
        self.to_ack: list[str] = []
        self.to_drop: list[str] = []
        self.handled: dict[str, None] = {}  # insertion-ordered set
        self.attempts: dict[str, int] = {}
        # (kind, id) acted on, in order; the latest HANDLED_MEMORY, so a run that is
        # steered for weeks does not grow its runner without bound.
        self.applied: collections.deque[tuple[str, str]] = collections.deque(maxlen=HANDLED_MEMORY)
        self._no_progress = 0
        self._degraded_since: str | None = None
        self._failed_polls = 0
        self._retries = 0

    # The transport's on_retry for the steer client: a retry is a degraded poll too.
    def note_retry(self, endpoint: str, attempt: int, reason: str) -> None:
        self._retries += 1
        if self._degraded_since is None:
            self._degraded_since = self._now()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.iterate():
                return

    def iterate(self) -> bool:
        """One poll and what follows it; False when the loop must end."""
        ack, drop = self.to_ack[:STEER_ACK_MAX], self.to_drop[: max(0, STEER_ACK_MAX - len(self.to_ack))]
        query = {"ack": ",".join(ack)}
        if drop:
            query["undeliverable"] = ",".join(drop)
        try:
            answer = self._client.call("GET", "steer", query=query)
        except RunTerminal:
            return False
        except TransportError:
            self._failed_polls += 1
            if self._degraded_since is None:
                self._degraded_since = self._now()
            self._back_off()
            return True
        self.to_ack = [i for i in self.to_ack if i not in ack]
        self.to_drop = [i for i in self.to_drop if i not in drop]
        self._report_recovery()
        messages = answer.get("messages") if isinstance(answer, dict) else None
        messages = [m for m in messages or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
        progress = False
        for message in messages:
            progress |= self._handle(message)
        if messages and not progress:
            self._back_off()
            return True
        self._no_progress = 0
        if not messages and not self.to_ack and not self.to_drop:
            try:
                idle = float(answer.get("next_poll_s", 0))
            except (TypeError, ValueError):
                idle = 0.0
            if idle > 0:
                self._sleep(min(idle, MAX_IDLE_S))
        return True

    def _handle(self, message: dict[str, Any]) -> bool:
        """Act on one message; True when it produced something to acknowledge."""
        mid, kind = message["id"], message.get("kind")
        if mid in self.handled:
            # Served again (our ack's answer was lost): acknowledge, never re-apply.
            if mid not in self.to_ack and mid not in self.to_drop:
                self.to_ack.append(mid)
            return True
        try:
            if kind == "interrupt":
                self._actor.interrupt()
            elif kind == "steer":
                self._actor.steer(mid, steer_line(message))
            else:
                raise ValueError("unknown kind")
        except Exception as exc:  # the act failed: nothing lands, nothing is acked
            self.attempts[mid] = self.attempts.get(mid, 0) + 1
            if kind != "interrupt" and self.attempts[mid] >= CONTROL_MESSAGE_MAX_ATTEMPTS:
                self._remember(mid)
                self.to_drop.append(mid)
                self._emit(
                    "steer_undeliverable",
                    {"id": mid, "kind": str(kind)[:16], "attempts": self.attempts[mid], "error": type(exc).__name__},
                )
                return True
            return False
        self._remember(mid)
        self.to_ack.append(mid)
        self.applied.append((str(kind), mid))
        return True

    def _remember(self, mid: str) -> None:
        self.handled[mid] = None
        while len(self.handled) > HANDLED_MEMORY:
            del self.handled[next(iter(self.handled))]

    def _back_off(self) -> None:
        delay = backoff.backoff_delay(
            self._no_progress, self._random(), base_s=NO_PROGRESS_BACKOFF_BASE_S, max_s=NO_PROGRESS_BACKOFF_MAX_S
        )
        self._no_progress += 1
        self._sleep(delay)

    def _report_recovery(self) -> None:
        if self._degraded_since is None:
            return
        data = {
            "since": self._degraded_since,
            "until": self._now(),
            "failed_polls": self._failed_polls,
            "retries": self._retries,
        }
        self._degraded_since, self._failed_polls, self._retries = None, 0, 0
        self._emit("steer_poll_degraded", data)


class JobActor:
    """Acts on the job child: SIGINT to its process group, steer lines to its stdin pipe.

    stdin is non-blocking, so a job that does not read cannot stall the loop (and the
    interrupts behind a steer): a line the pipe cannot take whole is finished before the
    next one and counts as landed only then.
    """

    def __init__(self, pid: int, stdin_fd: int) -> None:
        self._pid = pid
        self._fd = stdin_fd
        fcntl.fcntl(stdin_fd, fcntl.F_SETFL, fcntl.fcntl(stdin_fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._pending = b""
        self._pending_id: str | None = None
        self._landed: dict[str, None] = {}  # insertion-ordered, trimmed like ``handled``
        self._lock = threading.Lock()

    def interrupt(self) -> None:
        os.killpg(self._pid, signal.SIGINT)

    def steer(self, message_id: str, line: bytes) -> None:
        with self._lock:
            if message_id in self._landed:
                return
            if self._pending_id is not None:
                self._write_pending()
            if message_id in self._landed:
                return
            self._pending, self._pending_id = line, message_id
            self._write_pending()

    def _write_pending(self) -> None:
        while self._pending:
            try:
                written = os.write(self._fd, self._pending)
            except BlockingIOError:
                raise OSError(errno.EAGAIN, "the job's stdin is full") from None
            self._pending = self._pending[written:]
        assert self._pending_id is not None
        self._landed[self._pending_id] = None
        while len(self._landed) > HANDLED_MEMORY:
            del self._landed[next(iter(self._landed))]
        self._pending_id = None


class Steering:
    """The steer poll of one live runner: its own client (so its retries mark the poll
    degraded), started once the job's child exists, stopped when the job has exited."""

    def __init__(self, make_client: Callable[[Callable[[str, int, str], None]], Poller], emit) -> None:  # type: ignore[no-untyped-def]
        self._make_client = make_client
        self._emit = emit
        self.loop: SteerLoop | None = None
        self._thread: threading.Thread | None = None

    def attach(self, pid: int, stdin_fd: int) -> None:
        holder: list[SteerLoop] = []
        client = self._make_client(lambda endpoint, attempt, reason: holder[0].note_retry(endpoint, attempt, reason))
        self.loop = SteerLoop(client, JobActor(pid, stdin_fd), self._emit)
        holder.append(self.loop)
        self._thread = threading.Thread(target=self.loop.run, name="steer-poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        # Not joined: a parked long poll may take its full wait to return, and nothing it
        # could still do matters once the job has exited.
        if self.loop is not None:
            self.loop.stop.set()
