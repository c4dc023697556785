"""One PostgreSQL listener per channel and event loop, fanning ``NOTIFY`` out to the
coroutines parked in that process: the runner's steer long poll (channel
``holdfast_steer``) and the public API's event streams (``holdfast_run_events``).

A parked coroutine is an ``asyncio.Event`` in a dict keyed by the notification's payload
(a run id): no thread, no database connection. The hub holds one connection of its own
(``LISTEN``), opened lazily by the first waiter and kept for the life of the process. If
it drops, every parked waiter is woken (each re-reads the database, so nothing committed
meanwhile is missed) and ``available`` is False until the listener is back, so callers
fall back on their short polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from django.conf import settings

from controlplane import pgnotify
from holdfast_wire.logfmt import fields

logger = logging.getLogger(__name__)

# Seconds between two attempts to re-open a listener after it failed: a database restart
# takes seconds; waiters poll meanwhile, so nothing waits on this.
LISTENER_RETRY_S = 1.0


class Hub:
    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._listening = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.parked = 0

    @property
    def available(self) -> bool:
        """True when a parked waiter will be woken by a notification."""
        self._ensure_started()
        return self._listening.is_set()

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())

    @contextlib.contextmanager
    def waiter(self, key: str):
        """Register before reading the database, so a change committed between the read
        and the wait still wakes this waiter."""
        event = asyncio.Event()
        self._waiters.setdefault(key, set()).add(event)
        self.parked += 1
        try:
            yield event
        finally:
            self.parked -= 1
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[key]

    def _wake(self, key: str | None) -> None:
        targets = self._waiters.values() if key is None else [self._waiters.get(key, set())]
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
                    await conn.execute(f"LISTEN {self.channel}")
                    self._listening.set()
                    # Anything committed before LISTEN took effect is re-read by its waiter.
                    self._wake(None)
                    while True:
                        heard = False
                        async for note in conn.notifies(timeout=pgnotify.LISTEN_PING_S):
                            heard = True
                            self._wake(note.payload)
                        if not heard:
                            await pgnotify.ping_async(conn)  # quiet, or dead? (pgnotify.py)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the listener: reconnect, never crash waiters
                logger.warning("notify_listener_lost", extra=fields(channel=self.channel, error=type(exc).__name__))
            self._listening.clear()
            self._wake(None)
            await asyncio.sleep(LISTENER_RETRY_S)

    async def close(self) -> None:
        """Stop listening (a test's event loop ending before its database is dropped) and
        leave the registry: a later loop, even one that reuses this loop's id, gets a hub
        of its own rather than this one, which would call itself available."""
        for key in [key for key, found in _hubs.items() if found is self]:
            del _hubs[key]
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._listening.clear()


_hubs: dict[tuple[int, str], Hub] = {}


def hub(channel: str) -> Hub | None:
    """This event loop's hub for ``channel``, or None where there is no LISTEN (SQLite)."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        return None
    loop = asyncio.get_running_loop()
    found = _hubs.get((id(loop), channel))
    if found is None:
        found = _hubs[(id(loop), channel)] = Hub(channel)
    return found
