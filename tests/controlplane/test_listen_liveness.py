"""A LISTEN connection that went silent is found out and replaced (pgnotify.py,
LISTEN_PING_S): both listeners, ``execute()``'s result listener (a thread) and the
event loops' hub (steering, event streams), reach PostgreSQL through a real TCP proxy
that is then stalled, as a server or a network gone silent without a reset is. Until
the listener pings it, a stalled connection looks like a quiet one; without the ping
it stays "listening" forever and no notification reaches a waiter again.

A quiet connection that still answers is kept: the ping does not churn it."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connection

from controlplane import pghub, pgnotify
from controlplane.executions import notify
from tests.support.tcp_proxy import TcpProxy
from tests.timing import scaled, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

CHANNEL = "holdfast_liveness_test"


@pytest.fixture
def proxied(monkeypatch):
    """Listeners connect through a proxy and ping after 0.2 s of quiet."""
    params = pgnotify.connect_params()
    with TcpProxy((params.get("host") or "127.0.0.1", int(params.get("port") or 5432))) as proxy:
        monkeypatch.setattr(pgnotify, "connect_params", lambda: {**params, "host": "127.0.0.1", "port": proxy.port})
        monkeypatch.setattr(pgnotify, "LISTEN_PING_S", 0.2)
        monkeypatch.setattr(pgnotify, "LISTEN_PING_TIMEOUT_S", 0.5)
        yield proxy


def _notify(channel: str, payload: str) -> None:
    with connection.cursor() as cursor:  # straight to the server, not through the proxy
        cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def _notify_from_a_thread(channel: str, payload: str) -> None:
    try:
        _notify(channel, payload)
    finally:
        connection.close()  # the thread's own connection, not left for the teardown


def _reaches(listener: notify.Listener, key: str) -> bool:
    """Whether a notification sent now wakes a waiter registered on ``listener``."""
    woken = listener.register(key)
    try:
        _notify(notify.CHANNEL, key)
        return woken.wait(scaled(2))
    finally:
        listener.unregister(key, woken)


def test_the_result_listener_replaces_a_stalled_connection(proxied):
    listener = notify.Listener()
    try:
        assert listener.ready(scaled(10))
        assert _reaches(listener, "before")
        proxied.stall()
        wait_until(lambda: proxied.accepted >= 2, timeout=10, what="the listener connecting again")
        wait_until(lambda: _reaches(listener, "after"), timeout=10, what="a notification through the new connection")
    finally:
        listener.stop()


def test_the_result_listener_keeps_a_quiet_connection_that_answers(proxied):
    listener = notify.Listener()
    try:
        assert listener.ready(scaled(10))
        threading.Event().wait(2.0)  # ten pings' worth of quiet
        assert proxied.accepted == 1
        assert _reaches(listener, "still")
    finally:
        listener.stop()


def _hub_scenario(proxy: TcpProxy, stall: bool) -> tuple[bool, bool]:
    """A hub listens through ``proxy``; optionally stalled; then whether a notification
    wakes its waiter, and whether it holds a new connection."""

    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        hub = pghub.hub(CHANNEL)
        try:
            deadline = loop.time() + scaled(10)
            while not hub.available:
                assert loop.time() < deadline, "the hub never listened"
                await asyncio.sleep(0.05)
            if stall:
                proxy.stall()
                while proxy.accepted < 2 or not hub.available:
                    assert loop.time() < deadline + scaled(10), "the hub never connected again"
                    await asyncio.sleep(0.05)
            else:
                await asyncio.sleep(2.0)  # ten pings' worth of quiet
            for _ in range(10):  # the new connection's LISTEN may still be on its way
                with hub.waiter("run-1") as woken:
                    await loop.run_in_executor(None, _notify_from_a_thread, CHANNEL, "run-1")
                    try:
                        await asyncio.wait_for(woken.wait(), scaled(1))
                        return True, proxy.accepted >= 2
                    except TimeoutError:
                        continue
            return False, proxy.accepted >= 2
        finally:
            await hub.close()

    return asyncio.run(scenario())


def test_the_hub_replaces_a_stalled_connection(proxied):
    assert _hub_scenario(proxied, stall=True) == (True, True)


def test_the_hub_keeps_a_quiet_connection_that_answers(proxied):
    assert _hub_scenario(proxied, stall=False) == (True, False)
