"""PostgreSQL LISTEN/NOTIFY, the one way a committed change wakes a waiter in another
process (an ``execute()`` caller waiting on its result, a runner's long poll waiting on
a steer message). Notifications are hints: every waiter re-reads the row, and has a
slow poll for a notification that never comes."""

from __future__ import annotations

from django.db import connections

ALIAS = "default"


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
