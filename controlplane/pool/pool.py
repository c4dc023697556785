"""The sandbox connection pool: one per worker process.

Rules it implements (DESIGN.md, "Executions"):

* connections go to one configured address (a balancer or one host) and are retired at
  a max age jittered *down* by up to 20%, so a host a balancer deregistered drains
  before its deregistration delay ends;
* an execution whose connection was closing when it was dispatched, or that the host
  answered ``not_started``, never ran: it moves to another connection, at most 3 times
  (a host merely at capacity is waited for instead, within the acquire timeout);
* an execution that may have reached the host is never re-run: a drop fails it as
  interrupted;
* a call cancelled before dispatch, or made with no pool configured, returns at once,
  before any network or settings look-up.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.pool import outcome as texts
from controlplane.pool.connection import ConnectFailed, HostConnection, Pending
from controlplane.pool.outcome import RESULT_STATUSES, ExecRequest, Outcome
from controlplane.pool.state import ConnectionSnapshot, ConnState, PoolListener, RetireReason
from holdfast_wire import addresses, backoff, protocol
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.pool")

# How often the housekeeper looks for connections past their max age. Half a second is
# far below any max age we accept (>= 1 s) and costs nothing with a handful of connections.
HOUSEKEEPING_INTERVAL_S = 0.5
# How long a cancelled execution waits for the host's answer before giving up on it.
CANCEL_ACK_WAIT_S = 5.0
# Poll slice while waiting for a result, so a caller's cancel is seen promptly.
WAIT_SLICE_S = 0.1
# Backoff between connection attempts that failed, or landed on a draining host, and
# between retries of a host that answered at_capacity.
RETRY_BACKOFF_FIRST_S = 0.05
RETRY_BACKOFF_MAX_S = 1.0
# Finishes remembered for per-host rates: enough for minutes of a busy worker.
FINISHED_HISTORY = 10_000

CancelCheck = Callable[[], bool]


@dataclass(frozen=True)
class PoolConfig:
    url: str
    token: str = field(repr=False)
    max_age_s: float
    max_age_jitter: float
    per_connection_limit: int
    max_connections: int
    acquire_timeout_s: float
    connect_timeout_s: float
    max_moves: int
    result_grace_s: float
    required_isolation: str = protocol.FULL_ISOLATION

    @classmethod
    def from_settings(cls) -> PoolConfig:
        from django.conf import settings

        return cls(
            url=settings.SANDBOX_URL,
            token=settings.SANDBOX_TOKEN,
            max_age_s=settings.SANDBOX_CONNECTION_MAX_AGE_S,
            max_age_jitter=settings.SANDBOX_CONNECTION_MAX_AGE_JITTER,
            per_connection_limit=settings.SANDBOX_PER_CONNECTION_LIMIT,
            max_connections=settings.SANDBOX_MAX_CONNECTIONS,
            acquire_timeout_s=settings.SANDBOX_ACQUIRE_TIMEOUT_S,
            connect_timeout_s=settings.SANDBOX_CONNECT_TIMEOUT_S,
            max_moves=settings.SANDBOX_MAX_MOVES,
            result_grace_s=settings.SANDBOX_RESULT_GRACE_S,
            required_isolation=settings.SANDBOX_REQUIRED_ISOLATION,
        )

    def urls(self) -> list[str]:
        """One address (a balancer, or one host) or a comma-separated list of hosts the
        pool dials directly, in turn (``holdfast_wire.addresses``)."""
        return list(addresses.parse(self.url))

    def missing(self) -> str:
        """Which setting is absent or unusable; empty when the pool can dial."""
        urls = self.urls()
        if not urls or not all(addresses.usable(u) for u in urls):
            return "HOLDFAST_SANDBOX_URL" if not urls else "a usable HOLDFAST_SANDBOX_URL (ws:// or wss://)"
        if not self.token:
            return "HOLDFAST_SANDBOX_TOKEN"
        return ""


class _AtCapacity(Exception):
    pass


class SandboxPool:
    def __init__(self, config: PoolConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng or random.Random()
        self._lock = threading.Condition()
        self._connections: list[HostConnection] = []
        self._opening = 0
        self._closed = False
        self._housekeeper: threading.Thread | None = None
        self._hook_runner: threading.Thread | None = None
        self._client = f"worker pid={os.getpid()}"
        self._hooks: list[Callable[[SandboxPool], None]] = []
        self._listeners: list[PoolListener] = []
        # (monotonic time, host id) of recent finishes, for the drain page's rates.
        self._finished: deque[tuple[float, str]] = deque(maxlen=FINISHED_HISTORY)
        self._urls = config.urls()
        self._next_url = 0
        self._draining_ids: frozenset[str] = frozenset()
        self._draining_urls: frozenset[str] = frozenset()

    # --- public --------------------------------------------------------------------

    def run(self, request: ExecRequest, *, cancel: CancelCheck | None = None) -> Outcome:
        """Run one execution to its end. Never raises for the execution's own fate."""
        # Cheap local answers first: nothing here may wait on the network.
        if _cancelled(cancel):
            return Outcome.system("cancelled", texts.CANCELLED, attempts=0)
        missing = self.config.missing()
        if missing:
            return Outcome.system("failed", texts.MISCONFIGURED.format(missing=missing), attempts=0)
        frame_bytes = len(_execute_frame(request).encode())
        if frame_bytes > protocol.MAX_FRAME_BYTES:
            # Sent anyway, the host would close the connection and fail every execution
            # sharing it; refused here, nothing was sent.
            return Outcome.system(
                "failed", texts.TOO_LARGE.format(size=frame_bytes, limit=protocol.MAX_FRAME_BYTES), attempts=0
            )
        self._ensure_housekeeper()
        deadline = time.monotonic() + self.config.acquire_timeout_s
        moves = 0
        busy_retries = 0
        refused: set[HostConnection] = set()  # answered not_started for this request
        while True:
            try:
                conn = self._acquire(deadline, cancel, avoid=refused)
            except _AtCapacity:
                return Outcome.system(
                    "failed", texts.AT_CAPACITY.format(seconds=self.config.acquire_timeout_s), attempts=moves + 1
                )
            except ConnectFailed as exc:
                return Outcome.system(
                    "failed",
                    texts.CONNECT_FAILED.format(url=", ".join(map(addresses.public, self._urls)), reason=exc),
                    attempts=moves + 1,
                )
            if conn is None:  # cancelled while waiting for a slot: nothing was sent
                return Outcome.system("cancelled", texts.CANCELLED, attempts=moves + 1)
            pending = conn.dispatch(request)
            if pending is not None:
                answer = self._await(conn, pending, request, cancel, attempts=moves + 1)
                if isinstance(answer, Outcome):
                    return answer
                if answer.reason == "at_capacity":
                    # Busy, not leaving: wait a little and try again, within the acquire
                    # timeout, rather than spending a move on every refusal of a burst.
                    if not backoff.wait(
                        busy_retries, first_s=RETRY_BACKOFF_FIRST_S, max_s=RETRY_BACKOFF_MAX_S, deadline=deadline
                    ):
                        return Outcome.system(
                            "failed",
                            texts.AT_CAPACITY.format(seconds=self.config.acquire_timeout_s),
                            attempts=moves + 1,
                        )
                    busy_retries += 1
                    continue
                refused.add(conn)
            # It never left this process (or the host proved it never ran: not_started).
            if _cancelled(cancel):
                return Outcome.system("cancelled", texts.CANCELLED, attempts=moves + 1)
            if moves >= self.config.max_moves:
                return Outcome.system(
                    "failed", texts.NOT_PLACED.format(moves=self.config.max_moves), attempts=moves + 1
                )
            moves += 1
            log.info("execution_moved", extra=fields(execution_id=request.id, from_host_id=conn.host_id, moves=moves))

    def snapshot(self) -> list[ConnectionSnapshot]:
        """Per connection: host, state, age, in flight. For the drain page and tests."""
        with self._lock:
            conns = list(self._connections)
        return [c.snapshot() for c in conns]

    def add_listener(self, listener: PoolListener) -> None:
        """Tell ``listener`` of every connection's state changes from now on
        (``state.PoolListener``): the typed way to learn them, never the logs."""
        self._listeners.append(listener)

    def _notify(self, hook: str, conn: ConnectionSnapshot) -> None:
        for listener in list(self._listeners):
            try:
                getattr(listener, hook)(conn)
            except Exception:
                log.exception("pool_listener_failed", extra=fields(listener=type(listener).__name__, hook=hook))

    def finished_since(self, seconds: float) -> dict[str, int]:
        """Executions answered per host id in the last ``seconds``."""
        cutoff = time.monotonic() - seconds
        counts: dict[str, int] = {}
        for at, host_id in list(self._finished):
            if at >= cutoff:
                counts[host_id] = counts.get(host_id, 0) + 1
        return counts

    def add_housekeeping_hook(self, hook: Callable[[SandboxPool], None]) -> None:
        """Call ``hook(pool)`` on every housekeeping tick (publishing snapshots, applying
        operator drains), on a thread of their own: a hook stuck on a slow cache or
        database never holds up connection retirement. A failing hook is logged."""
        self._hooks.append(hook)
        self._ensure_housekeeper()

    def set_draining(self, *, host_ids: set[str], urls: set[str] = frozenset()) -> None:
        """Operator drains: retire connections to these hosts now rather than at max age,
        and, where the pool dials hosts directly, open no new connection to them."""
        self._draining_ids = frozenset(host_ids)
        self._draining_urls = frozenset(urls)
        for host_id in host_ids:
            self.retire_host(host_id)

    def retire_host(self, host_id: str, reason: RetireReason = RetireReason.OPERATOR_DRAIN) -> int:
        """Retire every connection to ``host_id`` now rather than at max age."""
        with self._lock:
            targets = [c for c in self._connections if c.host_id == host_id and c.state is ConnState.OPEN]
        for conn in targets:
            conn.retire(reason)
        return len(targets)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._connections)
            self._lock.notify_all()
        for conn in conns:
            conn.close("pool closed")

    # --- internals -----------------------------------------------------------------

    def _acquire(
        self, deadline: float, cancel: CancelCheck | None, avoid: set[HostConnection] = frozenset()
    ) -> HostConnection | None:
        failures = 0
        while True:
            with self._lock:
                if self._closed:
                    raise ConnectFailed("pool closed")
                self._prune()
                best = self._least_loaded(avoid)
                if best is not None:
                    return best
                # Retiring and expired connections do not count: a replacement may open
                # while they drain (the housekeeper retires the expired ones).
                live = (
                    sum(1 for c in self._connections if c.state is ConnState.OPEN and not c.expired()) + self._opening
                )
                # One connection opens at a time: callers arriving together share it
                # (up to the per-connection limit) instead of each dialing its own.
                may_open = live < self.config.max_connections and self._opening == 0
                if may_open:
                    self._opening += 1
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise _AtCapacity()
                    self._lock.wait(min(remaining, WAIT_SLICE_S))
            if _cancelled(cancel):
                return None
            if not may_open:
                continue
            conn = self._new_connection()
            try:
                conn.connect(
                    self.config.token,
                    timeout_s=self.config.connect_timeout_s,
                    client=self._client,
                    required_isolation=self.config.required_isolation,
                )
                if conn.host_id in self._draining_ids or conn.state is not ConnState.OPEN:
                    # Behind a balancer the pool cannot choose the host; a drained or
                    # draining one is let go at once and the next attempt dials again.
                    drained = conn.host_id in self._draining_ids
                    conn.retire(RetireReason.OPERATOR_DRAIN if drained else RetireReason.HOST_DRAINING)
                    raise ConnectFailed(f"host {conn.host_id} is draining")
            except ConnectFailed as exc:
                log.warning("connect_failed", extra=fields(url=addresses.public(conn.url), reason=str(exc)))
                # A restarting balancer or host refuses for a moment; keep trying until the
                # caller's deadline, then report the last reason.
                if not backoff.wait(
                    failures, first_s=RETRY_BACKOFF_FIRST_S, max_s=RETRY_BACKOFF_MAX_S, deadline=deadline
                ):
                    raise
                failures += 1
                continue
            else:
                with self._lock:
                    self._connections.append(conn)
            finally:
                with self._lock:
                    self._opening -= 1
                    self._lock.notify_all()

    def _pick_url(self) -> str:
        candidates = [u for u in self._urls if u not in self._draining_urls] or self._urls
        with self._lock:
            url = candidates[self._next_url % len(candidates)]
            self._next_url += 1
        return url

    def _new_connection(self) -> HostConnection:
        # Jitter down only: the max age stays an upper bound the balancer is sized against.
        jitter = 1.0 - self._rng.random() * self.config.max_age_jitter
        return HostConnection(
            self._pick_url(),
            max_age_s=self.config.max_age_s * jitter,
            limit=self.config.per_connection_limit,
            on_change=self._changed,
            notify=self._notify,
        )

    def _least_loaded(self, avoid: set[HostConnection]) -> HostConnection | None:
        candidates = [c for c in self._connections if c.can_take() and c not in avoid]
        if not candidates:
            return None
        return min(candidates, key=lambda c: c.in_flight)

    def _prune(self) -> None:
        self._connections = [c for c in self._connections if c.state is not ConnState.CLOSED]

    def _changed(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def _await(
        self,
        conn: HostConnection,
        pending: Pending,
        request: ExecRequest,
        cancel: CancelCheck | None,
        *,
        attempts: int,
    ) -> Outcome | protocol.NotStarted:
        """Wait for the host's answer: an outcome, or its not_started refusal (movable)."""
        backstop = time.monotonic() + request.timeout_ms / 1000 + self.config.result_grace_s
        try:
            while not pending.done.wait(WAIT_SLICE_S):
                if _cancelled(cancel):
                    conn.cancel(request.id)
                    pending.done.wait(CANCEL_ACK_WAIT_S)
                    return self._finish(conn, pending, attempts, cancelled=True)
                if time.monotonic() > backstop:
                    conn.cancel(request.id)
                    return Outcome.system(
                        "timed_out",
                        texts.TIMED_OUT.format(ms=request.timeout_ms),
                        host_id=conn.host_id,
                        attempts=attempts,
                        sent=True,
                    )
            return self._finish(conn, pending, attempts)
        finally:
            ran = not isinstance(pending.frame, protocol.NotStarted)
            conn.forget(request.id, ran=ran)
            if pending.frame is not None and ran:
                self._finished.append((time.monotonic(), conn.host_id))

    def _finish(
        self, conn: HostConnection, pending: Pending, attempts: int, *, cancelled: bool = False
    ) -> Outcome | protocol.NotStarted:
        frame = pending.frame
        if isinstance(frame, protocol.NotStarted):
            # A not_started(draining) answer already retired the connection (the session
            # hears it as the host draining).
            return frame
        if isinstance(frame, protocol.Result):
            if frame.status not in RESULT_STATUSES:
                return Outcome.system(
                    "failed",
                    f"The sandbox host reported an unknown status {frame.status[:40]!r}",
                    host_id=conn.host_id,
                    attempts=attempts,
                    sent=True,
                )
            return Outcome(
                status=frame.status,
                exit_code=frame.exit_code,
                stdout=frame.stdout,
                stderr=frame.stderr,
                duration_ms=frame.duration_ms,
                error=frame.error,
                host_id=conn.host_id,
                attempts=attempts,
                sent=True,
            )
        if cancelled:
            return Outcome.system("cancelled", texts.CANCELLED, host_id=conn.host_id, attempts=attempts, sent=True)
        if isinstance(frame, protocol.Error):
            return Outcome.system(
                "failed",
                f"The sandbox host refused the execution: {frame.message}",
                host_id=conn.host_id,
                attempts=attempts,
                sent=True,
            )
        # The socket dropped after the frame was sent: it may have run. Never re-run it.
        log.warning("execution_interrupted", extra=fields(execution_id=pending.request.id, host_id=conn.host_id))
        return Outcome.system("interrupted", texts.INTERRUPTED, host_id=conn.host_id, attempts=attempts, sent=True)

    # --- housekeeping --------------------------------------------------------------

    def _ensure_housekeeper(self) -> None:
        with self._lock:
            if self._housekeeper is None or not self._housekeeper.is_alive():
                self._housekeeper = threading.Thread(
                    target=self._housekeep, name="holdfast-pool-housekeeper", daemon=True
                )
                self._housekeeper.start()
            if self._hooks and (self._hook_runner is None or not self._hook_runner.is_alive()):
                self._hook_runner = threading.Thread(target=self._run_hooks, name="holdfast-pool-hooks", daemon=True)
                self._hook_runner.start()

    def _housekeep(self) -> None:
        # Idle connections must age out too: a deregistered host keeps an idle socket
        # open forever otherwise, and the balancer cuts it at the end of its delay.
        while True:
            with self._lock:
                if self._closed:
                    return
                conns = list(self._connections)
            for conn in conns:
                if conn.state is ConnState.OPEN and conn.expired():
                    conn.retire(RetireReason.MAX_AGE)
                elif conn.state is ConnState.RETIRING and conn.in_flight == 0:
                    conn.close("retired")
            time.sleep(HOUSEKEEPING_INTERVAL_S)

    def _run_hooks(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
            for hook in list(self._hooks):
                try:
                    hook(self)
                except Exception:
                    log.exception("housekeeping_hook_failed", extra=fields(hook=getattr(hook, "__name__", hook)))
            time.sleep(HOUSEKEEPING_INTERVAL_S)


def _execute_frame(request: ExecRequest) -> str:
    return protocol.encode(
        protocol.Execute(id=request.id, code=request.code, timeout_ms=request.timeout_ms, memory_mb=request.memory_mb)
    )


def _cancelled(cancel: CancelCheck | None) -> bool:
    """A cancel check that raises (its database read failed) counts as not cancelled:
    the execution's fate must not hang on a flaky probe."""
    if cancel is None:
        return False
    try:
        return bool(cancel())
    except Exception:
        log.warning("cancel_check_failed", exc_info=True)
        return False


# --- the process-wide pool ------------------------------------------------------------

_pool: SandboxPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> SandboxPool:
    """The pool of this process, built from settings on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SandboxPool(PoolConfig.from_settings())
        return _pool


def _after_fork() -> None:
    global _pool, _pool_lock
    # A forked child must not use its parent's sockets or threads, nor a lock another
    # parent thread held at the fork: start afresh.
    _pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)

__all__ = ["ConnState", "ConnectionSnapshot", "PoolConfig", "PoolListener", "RetireReason", "SandboxPool", "get_pool"]
