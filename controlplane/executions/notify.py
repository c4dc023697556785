"""Results pushed to whoever waits for them, not polled for.

DESIGN.md / issue 12: "``execute()`` waits on a notification (PostgreSQL LISTEN/NOTIFY
... keyed by execution id, sent after the result commits), with the row as the source
of truth and a slow poll only as a safety net."

- ``publish(id)``: ``pg_notify`` on ``CHANNEL`` with the execution id, right after a
  terminal state was stored (autocommit: it is delivered once that statement commits;
  PostgreSQL never delivers a notification of a transaction that rolled back).
- ``Listener``: one per process, a thread holding its own connection (never one of
  Django's) that LISTENs and wakes every caller waiting on that id. A caller registers
  before it reads the row, so a result stored in between is seen either way.
- On SQLite (the embedded default) there is no channel: callers poll as before.

The notification only says "look now": the caller always reads the row. A lost one
(the listener reconnecting, a notify that failed) costs at most the safety-net poll.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

from controlplane import pgnotify
from holdfast_wire import backoff
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.executions")

CHANNEL = "holdfast_execution_results"
# Reconnecting a lost listener: 0.1 s first (a blip), doubling to 5 s (an outage; the
# waiters poll the row meanwhile, so a slow reconnect costs latency, not results).
LISTEN_RETRY_FIRST_S = 0.1
LISTEN_RETRY_MAX_S = 5.0


def available() -> bool:
    return pgnotify.enabled() and settings.EXECUTION_RESULT_NOTIFY


def publish(execution_id: str) -> None:
    """Tell waiting callers that ``execution_id`` has a result. Never raises: the row
    is the truth, and a caller that misses this finds it by its safety-net poll."""
    if not available():
        return
    try:
        pgnotify.send(CHANNEL, str(execution_id))
    except Exception as exc:
        log.warning("result_notify_failed", extra=fields(execution_id=execution_id, error=exc.__class__.__name__))


class Listener:
    """The process's LISTEN connection and the callers waiting on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, list[threading.Event]] = {}
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.notifications = 0  # received, for tests and the bench
        self._thread = threading.Thread(target=self._run, name="holdfast-results-listener", daemon=True)
        self._thread.start()

    def register(self, execution_id: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(str(execution_id), []).append(event)
        return event

    def unregister(self, execution_id: str, event: threading.Event) -> None:
        with self._lock:
            events = self._waiters.get(str(execution_id), [])
            if event in events:
                events.remove(event)
            if not events:
                self._waiters.pop(str(execution_id), None)

    def ready(self, timeout: float) -> bool:
        """Whether the listener is LISTENing (a caller that registers now is covered)."""
        return self._ready.wait(timeout)

    def _wake(self, execution_id: str) -> None:
        with self._lock:
            events = list(self._waiters.get(execution_id, ()))
        for event in events:
            event.set()

    def _run(self) -> None:
        import psycopg

        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(autocommit=True, **pgnotify.connect_params()) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._ready.set()
                    failures = 0
                    heard = time.monotonic()
                    while not self._stop.is_set():
                        # Wakes at least every second to see whether it must stop.
                        for note in conn.notifies(timeout=1.0):
                            heard = time.monotonic()
                            self.notifications += 1
                            self._wake(note.payload)
                        if time.monotonic() - heard >= pgnotify.LISTEN_PING_S:
                            pgnotify.ping(conn)  # quiet, or dead? (pgnotify.py)
                            heard = time.monotonic()
            except Exception as exc:
                self._ready.clear()
                delay = backoff.delay(failures, first_s=LISTEN_RETRY_FIRST_S, max_s=LISTEN_RETRY_MAX_S)
                log.warning(
                    "results_listener_lost", extra=fields(error=exc.__class__.__name__, retry_s=round(delay, 1))
                )
                # Whoever waits now falls back on the safety-net poll until we are back.
                backoff.wait(failures, first_s=LISTEN_RETRY_FIRST_S, max_s=LISTEN_RETRY_MAX_S)
                failures += 1

    def stop(self) -> None:
        """Close the connection (a test database about to be dropped, a process ending)."""
        self._stop.set()
        self._thread.join(timeout=5)


_listener: Listener | None = None
_listener_lock = threading.Lock()


def shutdown() -> None:
    """Stop the process's listener, if it started one."""
    global _listener
    with _listener_lock:
        found, _listener = _listener, None
    if found is not None:
        found.stop()


def listener() -> Listener | None:
    """The process's listener, started on first use; None where there is no channel."""
    global _listener
    if not available():
        return None
    with _listener_lock:
        if _listener is None:
            _listener = Listener()
        return _listener
