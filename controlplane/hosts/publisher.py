"""The worker side of the drain page: a pool housekeeping hook.

Every ``HOSTS_SNAPSHOT_INTERVAL_S`` it

1. reads the operator drains from the database and applies them to the pool
   (``set_draining``), so a drained host's connections retire now, not at max age, and a
   pool that dials hosts directly stops dialing it;
2. publishes the pool's snapshot to the cache under this worker's key, with a TTL;
3. records what the pool saw in the registry: last seen, host ids, hosts that said they
   are draining, hosts that came back; and moves drained, unseen hosts to gone.

A host's ``draining`` frame is short-lived evidence: an idle connection that hears it
closes at once and the pool prunes it on its next acquire, possibly before any snapshot.
So the publisher is also a pool listener (``PoolListener.connection_retiring``): it
remembers the hosts whose connections retired as draining until the next publish.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import weakref
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections

from controlplane.hosts import actions, snapshots
from controlplane.pool.pool import SandboxPool
from controlplane.pool.state import ConnectionSnapshot, PoolListener, RetireReason
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.hosts")

_installed: weakref.WeakKeyDictionary[SandboxPool, Publisher] = weakref.WeakKeyDictionary()


def worker_label() -> str:
    # The same label the execution task writes on the rows it claims (Execution.worker),
    # so the page can tie running rows to the worker holding them.
    return f"{socket.gethostname()} pid={os.getpid()}"


class Publisher(PoolListener):
    def __init__(
        self,
        worker: str,
        *,
        interval_s: float,
        finished_window_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.interval_s = interval_s
        self.finished_window_s = finished_window_s
        self._clock = clock
        self._last = float("-inf")
        self._heard_draining: set[str] = set()
        self.__name__ = "hosts_publisher"  # the pool logs a failing hook by this name

    def heard_draining(self, host_id: str) -> None:
        self._heard_draining.add(host_id)  # set.add is atomic under the GIL

    def connection_retiring(self, conn: ConnectionSnapshot) -> None:
        """The pool's hook: a connection retires because its host said it drains."""
        if conn.retire_reason is RetireReason.HOST_DRAINING and conn.host_id:
            self.heard_draining(conn.host_id)

    def __call__(self, pool: SandboxPool) -> None:
        if self._clock() - self._last < self.interval_s:
            return
        self._last = self._clock()
        self.tick(pool)

    def tick(self, pool: SandboxPool) -> dict:
        # This thread outlives any request: drop a database connection that went stale.
        close_old_connections()
        ids, urls = actions.operator_drains()
        pool.set_draining(host_ids=ids, urls=urls)
        # The snapshot is taken after the drains are applied, so a publish that lists a
        # host under draining_applied shows its connections already retiring.
        hosts = snapshots.summarize(pool.snapshot(), pool.finished_since(self.finished_window_s))
        heard, self._heard_draining = self._heard_draining, set()
        for host_id in heard:
            item = hosts.setdefault(host_id, snapshots.empty_host())
            if actions.HOST_DRAINING_REASON not in item["retire_reasons"]:
                item["retire_reasons"].append(actions.HOST_DRAINING_REASON)
        snapshot = {
            "worker": self.worker,
            "published_at": time.time(),
            "interval_s": self.interval_s,
            "max_age_s": pool.config.max_age_s,
            "draining_applied": sorted(ids),
            "hosts": hosts,
        }
        snapshots.publish(snapshot, interval_s=self.interval_s)
        actions.observe(self.worker, hosts)
        actions.sweep_gone()
        return snapshot


def install(pool: SandboxPool) -> Publisher:
    """Attach the publisher to ``pool`` once (a second call returns the first one)."""
    existing = _installed.get(pool)
    if existing is not None:
        return existing
    publisher = Publisher(
        worker_label(),
        interval_s=settings.HOSTS_SNAPSHOT_INTERVAL_S,
        finished_window_s=settings.HOSTS_FINISHED_WINDOW_S,
    )
    _installed[pool] = publisher
    pool.add_listener(publisher)
    pool.add_housekeeping_hook(publisher)
    log.info(
        "snapshot_publisher_started", extra=fields(worker=publisher.worker, interval_s=round(publisher.interval_s, 1))
    )
    return publisher
