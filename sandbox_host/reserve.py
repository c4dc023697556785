"""Sandboxes prepared ahead of time, so an execution's code starts at once.

Starting a sandbox (bubblewrap, its namespaces and private root, ``setpriv``, an
interpreter) costs tens of milliseconds; running a trivial snippet in a sandbox that is
already up costs well under one. The reserve keeps ``size`` sandboxes started, each
contained exactly as a fresh one (same command line, same uid slot rules, same seccomp
filter and control groups) and waiting for code (``waiter.py``). An execution takes
one, if its limits fit the reserve's ceilings, and a background thread starts the next
when it slows nothing down:

* once the host has been quiet for ``quiet_s`` (no sandbox taken, no result sent).
  Preparing a sandbox costs a few milliseconds of CPU, and on a small machine that
  slows every process running beside it, however low its priority: a burst of
  executions is served from the reserve, and the reserve is refilled in the pause after
  it (``DEFAULT_RESERVE_QUIET_S`` gives the figures);
* at once after an execution's result is out (``replenish``) when the reserve runs low
  (``low_water`` or fewer ready), so a long burst rarely finds it empty. A sandbox taken
  does not start one: that would slow the very execution the reserve is there to speed
  up (the refill's timed checks can still find it low while an execution runs).

A reserve of ``low_water`` + 1 or fewer (sizes 1 and 2) and ``quiet_s=0`` refill after
every result, as the reserve always did; only a reserve larger than a burst serves the
whole burst without a sandbox started beside it.

Each prepared sandbox is used once: one execution's code, then it ends. Nothing is
shared between two executions but the host itself, which is why the containment tests
hold for prepared sandboxes too (``tests/sandbox_host/test_escape.py`` runs both ways).
A prepared sandbox that died while waiting (it never read any code) is let go and the
next one tried, then a fresh one: an execution is never lost to the reserve.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from holdfast_wire import backoff

from . import defaults
from .children import Child, ChildError, Limits
from .log import log


class Reserve:
    def __init__(
        self,
        size: int,
        *,
        isolation,
        take_slot: Callable[[], int | None],
        return_slot: Callable[[int], None],
        # Limits
        max_memory_mb: int = defaults.DEFAULT_RESERVE_MAX_MEMORY_MB,
        max_timeout_ms: int = defaults.DEFAULT_RESERVE_MAX_TIMEOUT_MS,
        quiet_s: float = defaults.DEFAULT_RESERVE_QUIET_S,
    ) -> None:
        self.size = size
        self.quiet_s = quiet_s
        self.low_water = max(1, int(size * defaults.DEFAULT_RESERVE_LOW_SHARE))
        # When a sandbox was last taken or a result sent: the quiet is counted from it.
        self._last_busy = float("-inf")
        self.isolation = isolation
        self.ceilings = Limits(timeout_ms=max_timeout_ms, memory_mb=max_memory_mb)
        self._take_slot = take_slot
        self._return_slot = return_slot
        self._cond = threading.Condition()
        self._ready: list[Child] = []
        # The memory the last execution asked for: the next prepared sandboxes' groups
        # start at it, so one asking the same (most do) costs no rewrite at delivery.
        self._expected_memory_mb = max_memory_mb
        self._closed = False
        self._thread = threading.Thread(target=self._refill, name="reserve", daemon=True)
        self._thread.start()

    def take(self, limits: Limits) -> Child | None:
        """A prepared sandbox for an execution with ``limits``, or None (none ready, or
        the limits are above the ceilings it was started under)."""
        with self._cond:
            # Every execution counts as the host being busy, one that does not fit too.
            self._last_busy = time.monotonic()
            if limits.memory_mb > self.ceilings.memory_mb or limits.timeout_ms > self.ceilings.timeout_ms:
                return None
            self._expected_memory_mb = max(limits.memory_mb, defaults.DEFAULT_RESERVE_MIN_GROUP_MEMORY_MB)
            return self._ready.pop(0) if self._ready else None

    def replenish(self) -> None:
        """An execution's result has been sent: start the next prepared sandbox now if
        the reserve runs low, else once the host has been quiet (``_due_in``)."""
        with self._cond:
            self._last_busy = time.monotonic()
            self._cond.notify_all()

    def ready(self) -> int:
        with self._cond:
            return len(self._ready)

    def close(self) -> None:
        """Stop refilling and let every waiting sandbox go (a drain, or the host exits)."""
        with self._cond:
            self._closed = True
            ready, self._ready = self._ready, []
            self._cond.notify_all()
        for child in ready:
            self._let_go(child)

    def _let_go(self, child: Child) -> None:
        child.discard()
        child.cleanup()
        self._return_slot(child.slot)

    def _due_in(self, now: float) -> float | None:
        """Seconds until the next sandbox should be started (0: now), or None while
        none is wanted. Called with the lock held."""
        if self._closed or len(self._ready) >= self.size:
            return None
        if len(self._ready) <= self.low_water:
            return 0.0
        return max(0.0, self._last_busy + self.quiet_s - now)

    def _refill(self) -> None:
        """Runs as long as the host: this thread is the parent of every sandbox it
        started, and a sandbox's parent-death signal (it must die with the host) fires
        when the thread that started it ends, not only the process. So after ``close``
        it parks instead of returning, while executions may still run in its sandboxes."""
        failures = 0
        while True:
            with self._cond:
                # Waking now and then to let go of sandboxes that died waiting, so the
                # reserve refills instead of holding corpses until someone takes them.
                # Only a result wakes it early (``replenish``): a sandbox taken does not,
                # so taking one never starts the next beside the execution it serves.
                due = self._due_in(time.monotonic())
                if due != 0.0:
                    check = defaults.DEFAULT_RESERVE_CHECK_S
                    self._cond.wait(timeout=check if due is None else min(due, check))
                dead = [child for child in self._ready if child.proc is None or child.proc.poll() is not None]
                self._ready = [child for child in self._ready if child not in dead]
                wanted = self._due_in(time.monotonic()) == 0.0
            for child in dead:
                log("reserve_sandbox_died", slot=child.slot)
                self._let_go(child)
            if not wanted:
                continue
            child = self._prepare()
            if child is None:
                # No free slot, or the sandbox would not start.
                backoff.wait(
                    failures, first_s=defaults.DEFAULT_RESERVE_RETRY_S, max_s=defaults.DEFAULT_RESERVE_RETRY_MAX_S
                )
                failures += 1
                continue
            failures = 0
            with self._cond:
                if not self._closed:
                    self._ready.append(child)
                    continue
            self._let_go(child)

    def _prepare(self) -> Child | None:
        slot = self._take_slot()
        if slot is None:
            return None
        child = Child(
            None,
            self.ceilings,
            isolation=self.isolation,
            uid=self.isolation.uid_for(slot),
            slot=slot,
            group_memory_mb=self._expected_memory_mb,
        )
        try:
            child.start()
        except ChildError as exc:
            log("reserve_start_failed", error=str(exc))
            self._return_slot(slot)
            return None
        return child
