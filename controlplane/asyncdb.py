"""Database work from an ASGI coroutine (the steer long poll, the API's event stream):
run a synchronous function on asgiref's thread pool, with the thread's database
connection checked before and closed after, as Django's request cycle would do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections


def in_executor(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    def run(*args: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    # Not thread-sensitive: a parked poll must not queue behind another on one thread.
    return sync_to_async(run, thread_sensitive=False)
