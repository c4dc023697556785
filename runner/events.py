"""Batches a run's events to the control plane: in order, each exactly once, through outages.

Producers (the threads reading the child's stdout and stderr) call ``EventStream.emit``.
One sender thread takes up to a batch at a time and posts it through the transport, so one
batch is in flight at most (single flight). While it is in flight, or retrying through an
outage, events keep buffering in order; when the buffer is full ``emit`` blocks, which stops
the reader, which fills the child's pipe, which pauses the child: backpressure instead of
unbounded memory.

Each batch gets its batch key once, when it is cut; every retry of that batch (inside the
transport, or a later replay) carries the same key, so the server appends it once.

A drain that fails for good (the transport gave up) stops sending but never blocks a
producer again: ``emit`` discards from then on, so the child is not stuck on a full pipe and
can exit. The failure is kept in ``failure`` and reported once to each ``on_failure`` hook
(the job runner uses one to clear an armed command timeout).

A ``409 events_truncated`` answer is not a failure: the run reached its event quota (or
sent an event over the size limit), the server recorded one ``events_truncated`` event,
and it refuses every later batch. The stream stops sending, says so once on stderr, and
discards from then on (``truncated``); the job keeps running and its verdict is its own.
"""

from __future__ import annotations

import collections
import datetime
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import IO, Any, Protocol

from runner.log import fields, log
from runner.redact import Redactor
from runner.transport import ServerRejected, TransportError

# Limits
# 50 events per batch: small enough that a batch is one quick transaction on the server.
DEFAULT_BATCH_MAX_EVENTS = 50
# 900 KiB per batch (encoded): under the server's 1 MiB body limit with room for the envelope.
DEFAULT_BATCH_MAX_BYTES = 900 * 1024
# Two batches' worth pending (one in flight, one waiting): beyond that the child is paused.
DEFAULT_MAX_PENDING_EVENTS = 2 * DEFAULT_BATCH_MAX_EVENTS

# One output line is cut here: a child printing a megabyte without a newline still makes
# bounded events.
DEFAULT_LINE_MAX_BYTES = 64 * 1024

# The server's answer (409) once a run's events are truncated: stop sending, keep running.
EVENTS_TRUNCATED_CODE = "events_truncated"

# Timeouts
# A partial batch waits at most 100 ms for company: output shows up promptly without a
# request per line.
DEFAULT_FLUSH_INTERVAL_S = 0.1


class EventPoster(Protocol):
    def call(self, method: str, endpoint: str, *, body: Any = None) -> Any: ...


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class EventStream:
    def __init__(
        self,
        client: EventPoster,
        *,
        redactor: Redactor | None = None,
        # Limits
        batch_max_events: int = DEFAULT_BATCH_MAX_EVENTS,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
        max_pending_events: int = DEFAULT_MAX_PENDING_EVENTS,
        # Timeouts
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        new_key: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        if max_pending_events < batch_max_events:
            raise ValueError("the buffer must hold at least one batch")
        self._client = client
        self._redactor = redactor or Redactor()
        self._batch_max_events = batch_max_events
        self._batch_max_bytes = batch_max_bytes
        self._max_pending = max_pending_events
        self._flush_interval_s = flush_interval_s
        self._new_key = new_key
        self._cond = threading.Condition()
        self._pending: collections.deque[tuple[dict[str, Any], int, float]] = collections.deque()
        self._closing = False
        self.failure: TransportError | None = None
        self.truncated = False
        self.sent = 0
        self.dropped = 0
        self._on_failure: list[Callable[[TransportError], None]] = []
        self._thread = threading.Thread(target=self._drain, name="runner-events", daemon=True)
        self._thread.start()

    def on_failure(self, hook: Callable[[TransportError], None]) -> None:
        """Call ``hook`` once if the drain fails for good (at once if it already has)."""
        with self._cond:
            if self.failure is None:
                self._on_failure.append(hook)
                return
            failure = self.failure
        hook(failure)

    def emit(self, type_: str, data: dict[str, Any]) -> bool:
        """Queue one event (redacted now); blocks while the buffer is full. Returns False if
        the event was discarded because the drain has failed for good or the stream closed."""
        if self.failure is not None or self.truncated:
            # Fast path once failed or truncated: the reader must keep up with a flooding child.
            with self._cond:
                self.dropped += 1
            return False
        event = {"type": type_, "data": self._redactor.value(data), "ts": _now_iso()}
        size = len(json.dumps(event, separators=(",", ":")).encode())
        with self._cond:
            while len(self._pending) >= self._max_pending and not self._stopped():
                self._cond.wait()
            if self.failure is not None or self.truncated or self._closing:
                self.dropped += 1
                return False
            self._pending.append((event, size, time.monotonic()))
            self._cond.notify_all()
            return True

    def close(self, timeout_s: float | None = None) -> TransportError | None:
        """Flush what is buffered, stop the sender, and return the drain's failure if any."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        return self.failure

    def _cut_batch(self) -> list[dict[str, Any]] | None:
        """Wait for a batch worth sending and take it off the buffer; None when done."""
        with self._cond:
            while True:
                if self._pending:
                    full = len(self._pending) >= self._batch_max_events
                    age = time.monotonic() - self._pending[0][2]
                    if full or self._closing or age >= self._flush_interval_s:
                        break
                    self._cond.wait(self._flush_interval_s - age)
                elif self._closing:
                    return None
                else:
                    self._cond.wait()
            batch: list[dict[str, Any]] = []
            size = 0
            while self._pending and len(batch) < self._batch_max_events:
                event, event_size, _ = self._pending[0]
                # Always at least one event, so an oversized event cannot wedge the stream.
                if batch and size + event_size > self._batch_max_bytes:
                    break
                self._pending.popleft()
                batch.append(event)
                size += event_size
            # Room freed: wake producers blocked on a full buffer.
            self._cond.notify_all()
            return batch

    def _drain(self) -> None:
        while True:
            batch = self._cut_batch()
            if batch is None:
                return
            # The key is minted once per batch; the transport's retries resend this body.
            body = {"batch_key": self._new_key(), "events": batch}
            try:
                self._client.call("POST", "events", body=body)
            except ServerRejected as exc:
                if exc.code == EVENTS_TRUNCATED_CODE:
                    self._truncate(lost=len(batch))
                else:
                    self._fail(exc, lost=len(batch))
                return
            except TransportError as exc:
                self._fail(exc, lost=len(batch))
                return
            except Exception as exc:
                # A bug must not wedge producers on a full buffer: fail the drain like an outage.
                self._fail(TransportError(f"events: {type(exc).__name__}"), lost=len(batch))
                return
            with self._cond:
                self.sent += len(batch)

    def _stopped(self) -> bool:
        return self.failure is not None or self.truncated or self._closing

    def _truncate(self, *, lost: int) -> None:
        with self._cond:
            self.truncated = True
            self.dropped += lost + len(self._pending)
            self._pending.clear()
            # Producers blocked on the full buffer must resume: the job keeps running.
            self._cond.notify_all()
        # The run reached its event limit: the job keeps running, its output is not sent.
        log.warning("events_truncated", extra=fields(events_dropped=self.dropped))

    def _fail(self, exc: TransportError, *, lost: int) -> None:
        with self._cond:
            self.failure = exc
            self.dropped += lost + len(self._pending)
            self._pending.clear()
            hooks, self._on_failure = self._on_failure, []
            # Producers blocked on the full buffer must resume, or the child never exits.
            self._cond.notify_all()
        for hook in hooks:
            hook(exc)


def pump_lines(
    pipe: IO[bytes], stream: EventStream, type_: str, *, line_max_bytes: int = DEFAULT_LINE_MAX_BYTES
) -> None:
    """Read a child's pipe to its end, one event per line. Reading never stops early: after
    the drain fails for good ``emit`` discards at once, so the child is never left blocked
    on a full pipe and can exit.

    A line is decoded as UTF-8 with each invalid byte sequence replaced by U+FFFD, and
    each NUL byte is replaced by U+FFFD too: PostgreSQL's jsonb cannot hold U+0000, and
    the API refuses a batch containing it, which would cost the run all its output.
    Those two replacements are the only ones (docs/runner-api.md)."""
    while True:
        line = pipe.readline(line_max_bytes)
        if not line:
            return
        text = line.decode("utf-8", "replace").replace("\x00", "\ufffd")
        stream.emit(type_, {"line": text.rstrip("\n")})
