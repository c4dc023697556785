"""One PostgreSQL listener per web process, fanning ``NOTIFY holdfast_steer`` out to the
polls parked in that process.

A parked poll is an ``asyncio.Event`` in a dict keyed by run id: no thread, no database
connection. The hub holds one connection of its own (``LISTEN``), opened lazily by the
first poll and kept for the life of the process. If it drops, every parked poll is woken
(each re-reads the database, so nothing sent meanwhile is missed) and polls answer at once
(short polls) until the listener is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from django.conf import settings

from controlplane import pgnotify
from holdfast_wire.logfmt import fields

from .steering import STEER_CHANNEL

logger = logging.getLogger(__name__)

# Seconds between two attempts to re-open the listener after it failed: a database
# restart takes seconds; polls are short polls meanwhile, so nothing waits on this.
LISTENER_RETRY_S = 1.0


class SteerHub:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._listening = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.parked = 0

    @property
    def available(self) -> bool:
        """True when a parked poll will be woken by a notification."""
        self._ensure_started()
        return self._listening.is_set()

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())

    @contextlib.contextmanager
    def waiter(self, run_id: str):
        """Register before reading the database, so a message committed between the read
        and the wait still wakes this poll."""
        event = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(event)
        self.parked += 1
        try:
            yield event
        finally:
            self.parked -= 1
            waiting = self._waiters.get(run_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[run_id]

    def _wake(self, run_id: str | None) -> None:
        targets = self._waiters.values() if run_id is None else [self._waiters.get(run_id, set())]
        for events in targets:
            for event in events:
                event.set()

    async def _listen(self) -> None:
        import psycopg

        params = pgnotify.connect_params()
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(autocommit=True, **params)
                async with conn:
                    await conn.execute(f"LISTEN {STEER_CHANNEL}")
                    self._listening.set()
                    # Anything committed before LISTEN took effect is re-read by its poll.
                    self._wake(None)
                    async for note in conn.notifies():
                        self._wake(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the listener: reconnect, never crash polls
                logger.warning("steer_listener_lost", extra=fields(error=type(exc).__name__))
            self._listening.clear()
            self._wake(None)
            await asyncio.sleep(LISTENER_RETRY_S)


_hubs: dict[int, SteerHub] = {}


def hub() -> SteerHub | None:
    """This event loop's hub, or None where no long poll is possible (SQLite)."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        return None
    loop = asyncio.get_running_loop()
    found = _hubs.get(id(loop))
    if found is None:
        found = _hubs[id(loop)] = SteerHub()
    return found
