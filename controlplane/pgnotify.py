"""PostgreSQL LISTEN/NOTIFY, the one way a committed change wakes a waiter in another
process (an ``execute()`` caller waiting on its result, a runner's long poll waiting on
a steer message). Notifications are hints: every waiter re-reads the row, and has a
slow poll for a notification that never comes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator

from django.db import connections

ALIAS = "default"
# A LISTEN connection says nothing while nothing happens, so a dead one (a server gone
# without a word, a stalled proxy, a dropped NAT entry) looks like a quiet one, and its
# waiters would wait out their slow polls for as long as the process lives. A listener
# quiet for LISTEN_PING_S asks the server a ``SELECT 1``; with no answer within
# LISTEN_PING_TIMEOUT_S the connection is cut and the listener connects again. Waiters
# poll meanwhile, so these bound how long results arrive late, never whether they do.
LISTEN_PING_S = 10.0
LISTEN_PING_TIMEOUT_S = 5.0


def enabled() -> bool:
    return connections[ALIAS].vendor == "postgresql"


def send(channel: str, payload: str) -> None:
    """NOTIFY ``channel`` with ``payload``; PostgreSQL delivers it when the current
    transaction commits (at once outside one), and drops it on rollback."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def connect_params() -> dict:
    """What Django would connect with (the test runner's database, OPTIONS such as
    ``sslmode`` included), for a listener's own psycopg connection, less the objects
    only Django's cursors use."""
    params = connections[ALIAS].get_connection_params()
    return {k: v for k, v in params.items() if k not in ("cursor_factory", "context") and v is not None}


def ping(conn) -> None:
    """``SELECT 1`` on a listener's (psycopg) connection; raises if no answer comes
    within LISTEN_PING_TIMEOUT_S: the connection is cut, and the caller reconnects."""
    with _cutter(conn) as cut:
        lock = threading.Lock()
        answered = False

        def overdue() -> None:
            with lock:
                if not answered:
                    cut()

        timer = threading.Timer(LISTEN_PING_TIMEOUT_S, overdue)
        timer.daemon = True
        timer.start()
        try:
            conn.execute("SELECT 1")
        finally:
            # A timer firing as the answer arrives cuts nothing, and is done before the
            # duplicate descriptor is closed (its number could be reused at once).
            with lock:
                answered = True
            timer.cancel()
            timer.join()


async def ping_async(conn) -> None:
    """``ping`` for an asyncio listener's connection."""
    with _cutter(conn) as cut:
        timer = asyncio.get_running_loop().call_later(LISTEN_PING_TIMEOUT_S, cut)
        try:
            await conn.execute("SELECT 1")
        finally:
            timer.cancel()


@contextlib.contextmanager
def _cutter(conn) -> Iterator[Callable[[], None]]:
    """A function that shuts ``conn``'s socket down both ways: a call blocked on it
    sees the connection end, as on a server that closed it. Through a duplicate of the
    descriptor, which stays ours to close whatever psycopg does with its own."""
    sock = socket.socket(fileno=os.dup(conn.pgconn.socket))

    def cut() -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    try:
        yield cut
    finally:
        sock.close()
