"""Loaded only into ``bench/host_marks.py``'s host (through a ``sitecustomize`` that
bench writes): a timestamp at each step an execution takes inside the host, written to
``HOLDFAST_BENCH_HOST_MARKS`` by wrapping the functions the host calls. Benchmark
instrumentation, never production. ``time.monotonic`` is one clock for every process
of the machine, so the bench's client can put its own marks beside these."""

from __future__ import annotations

import functools
import os
import select as _select
import threading
import time
import types

from holdfast_wire import protocol
from sandbox_host import children, connection, executions, template_host

_out = open(os.environ["HOLDFAST_BENCH_HOST_MARKS"], "a", buffering=1)
_lock = threading.Lock()


def mark(what: str) -> None:
    line = f"{time.monotonic():.7f} {what}\n"
    with _lock:
        _out.write(line)


def _around(owner, name: str, before: str | None, after: str | None, when=None) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        marked = when is None or when(*args, **kwargs)
        if before and marked:
            mark(before)
        result = inner(*args, **kwargs)
        if after and marked:
            mark(after)
        return result

    setattr(owner, name, wrapper)


def _readable(*args, **kwargs):
    readable, writable, failed = _select.select(*args, **kwargs)
    if readable:
        mark("socket readable")
    return readable, writable, failed


# The connection's read loop waits in select.select: a module of our own in its place.
connection.select = types.SimpleNamespace(select=_readable)
_around(connection.Connection, "_handle_event", "websocket frame read", None)
_around(connection.Connection, "_handle_session_events", "frame decoded", None)
_around(connection.Connection, "_execute", "execute requested", None)
_around(executions.Admission, "admit", None, "admitted")
_around(connection, "run_execution", "execution thread running", None)
_around(children.Child, "deliver", "deliver begins", "code delivered")
_around(template_host.TemplateProcess, "set_priority", None, "priority restored")
_around(children.Child, "wait", None, "outcome read")


def _is_result(self, *frames) -> bool:
    return any(isinstance(frame, protocol.Result) for frame in frames)


def _is_started(self, *frames) -> bool:
    return len(frames) == 1 and isinstance(frames[0], protocol.Started)  # sent on its own


_around(connection.Connection, "send", "result send begins", "result sent", when=_is_result)
_around(connection.Connection, "send", "started send begins", "started sent", when=_is_started)
