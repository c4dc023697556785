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

The notification says "look now". A lost one (the listener reconnecting, a notify
that failed) costs at most the safety-net poll.

The result in the notification: the statement that stores a result (actions.finish)
also builds, from the row it wrote, ``"<id> <json>"`` (the JSON holding the
``ANNOUNCED`` fields) and sends it on ``RESULT_CHANNEL`` when it is at most
``ANNOUNCED_MAX_BYTES``, before the id alone on ``CHANNEL``. PostgreSQL delivers both
only once that statement has committed, in that order, so the result is the row as
stored, and ``execute()`` returns it without reading the row again (one query less on
every execution's path). A larger result, and every other announcement (a cancel, the
sweep's verdict), comes as the id alone: the caller reads the row, as it does after the
safety-net poll.

Two channels, for a rolling deploy: a process of the release before this one listens on
``CHANNEL`` and takes its whole payload as the id, so the id alone goes on there still;
a process of this release listens on both, and an id-only wake never clears a result
that came first. (The next release may drop the id on ``CHANNEL`` for stored results.)

Trust: PostgreSQL lets any role that can connect to the database send a notification.
Such a role could hand a waiting caller a made-up result for an id it knows, where
before it could only make it read the row early. PostgreSQL grants ``CONNECT`` to
``PUBLIC`` by default, so revoking it (operations.md, "The database") is required.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from django.conf import settings

from controlplane import pgnotify
from controlplane.executions import fields as output_fields
from holdfast_wire import backoff
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.executions")

CHANNEL = "holdfast_execution_results"
RESULT_CHANNEL = "holdfast_execution_results_carried"
# Reconnecting a lost listener: 0.1 s first (a blip), doubling to 5 s (an outage; the
# waiters poll the row meanwhile, so a slow reconnect costs latency, not results).
LISTEN_RETRY_FIRST_S = 0.1
LISTEN_RETRY_MAX_S = 5.0
# The result's fields a notification carries: every field of ``api.ExecutionResult``
# but the id, which leads the payload.
ANNOUNCED = ("status", "stdout", "stderr", "exit_code", "duration_ms", "error", "host_id", "attempts")
# The largest result (its JSON) sent inside the notification. Every process that listens
# receives every announcement, so a large output is not copied to all of them: its
# caller reads the row instead. PostgreSQL caps a payload at its block size less 192
# bytes (7,999 with the default 8 kB), and a payload over the cap would fail the
# statement that stores the result: this fits block sizes of 4 kB and up.
ANNOUNCED_MAX_BYTES = 3000


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


class Woken(threading.Event):
    """Set when a caller's execution is announced; ``result`` is the stored result the
    announcement carried (its ``ANNOUNCED`` fields), or None: then read the row."""

    def __init__(self) -> None:
        super().__init__()
        self.result: dict | None = None


def _announced(text: str) -> dict | None:
    """The result a payload carries, or None for anything but the finish statement's
    JSON (the caller then reads the row)."""
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict) or set(found) != set(ANNOUNCED):
        return None
    # As the row gives them back: output the database cannot hold as text (NUL) is
    # stored encoded (fields.py), and the statement copied the stored form.
    for name in ("stdout", "stderr"):
        if not isinstance(found[name], str):
            return None
        try:
            found[name] = output_fields.decode(found[name])
        except ValueError:
            return None
    return found


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

    def register(self, execution_id: str) -> Woken:
        event = Woken()
        with self._lock:
            self._waiters.setdefault(str(execution_id), []).append(event)
        return event

    def unregister(self, execution_id: str, event: Woken) -> None:
        with self._lock:
            events = self._waiters.get(str(execution_id), [])
            if event in events:
                events.remove(event)
            if not events:
                self._waiters.pop(str(execution_id), None)

    def ready(self, timeout: float) -> bool:
        """Whether the listener is LISTENing (a caller that registers now is covered)."""
        return self._ready.wait(timeout)

    def _wake(self, channel: str, payload: str) -> None:
        execution_id, _, announced = payload.partition(" ")
        with self._lock:
            events = list(self._waiters.get(execution_id, ()))
        result = _announced(announced) if events and announced and channel == RESULT_CHANNEL else None
        for event in events:
            if result is not None:
                event.result = result
            event.set()

    def _run(self) -> None:
        import psycopg

        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(autocommit=True, **pgnotify.connect_params()) as conn:
                    conn.execute(f"LISTEN {CHANNEL}; LISTEN {RESULT_CHANNEL}")
                    self._ready.set()
                    failures = 0
                    heard = time.monotonic()
                    while not self._stop.is_set():
                        # Wakes at least every second to see whether it must stop.
                        for note in conn.notifies(timeout=1.0):
                            heard = time.monotonic()
                            self.notifications += 1
                            self._wake(note.channel, note.payload)
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
