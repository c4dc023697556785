"""The threads that run executions, kept once idle.

Starting a thread costs the connection's thread about 0.2 ms here (it waits until the new
thread runs; ``bench/thread_handoff.py``): on the path of every execution, between its frame and its code. A thread
that has finished an execution waits for the next one instead, for a while; handing it
one is a single wake. At most ``keep`` wait; one that waited ``idle_s`` with nothing to
do ends. A thread only ever waits between executions, so whatever an execution started
(a sandbox whose parent-death signal follows the thread that forked it) has ended
before its thread can.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from . import defaults
from .log import log

Job = tuple[Callable[[], None], str]
IDLE_NAME = "exec-idle"


class Workers:
    def __init__(self, *, keep: int = defaults.DEFAULT_IDLE_EXECUTION_THREADS,
                 idle_s: float = defaults.DEFAULT_IDLE_EXECUTION_THREAD_S) -> None:  # fmt: skip
        self.keep = keep
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Job]] = []  # one inbox per waiting thread, latest last

    def run(self, job: Callable[[], None], name: str) -> None:
        """Run ``job`` on a thread of its own, named ``name``: a waiting one, else a new
        one. Raises what ``Thread.start`` raises when no thread can be had."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is not None:
                inbox.put((job, name))
                return
        threading.Thread(target=self._serve, args=((job, name),), name=name, daemon=True).start()

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def _serve(self, first: Job) -> None:
        inbox: queue.SimpleQueue[Job] = queue.SimpleQueue()
        job: Job | None = first
        while job is not None:
            work, name = job
            threading.current_thread().name = name
            try:
                work()
            except Exception as exc:  # a job handles its own; this thread lives on
                log("execution_thread_error", error=exc.__class__.__name__)
            # Nothing of the execution that ended (its frame, its code) is held while waiting.
            work = job = None
            threading.current_thread().name = IDLE_NAME
            job = self._next(inbox)

    def _next(self, inbox: queue.SimpleQueue[Job]) -> Job | None:
        with self._lock:
            if len(self._idle) >= self.keep:
                return None
            self._idle.append(inbox)
        try:
            return inbox.get(timeout=self.idle_s)
        except queue.Empty:
            with self._lock:
                if inbox in self._idle:
                    self._idle.remove(inbox)
                    return None
            return inbox.get()  # handed a job the moment the wait ended: it is in the inbox
