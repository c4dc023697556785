"""Celery worker signals that attach the snapshot publisher to the process's pool.

With ``--pool threads`` (the Procfile's) or ``solo`` the worker's main process runs the
tasks, so ``worker_ready`` installs it there. With ``prefork`` each child has its own
pool (``get_pool`` starts afresh after a fork), so ``worker_process_init`` installs it
in each child and the parent, which runs no task, publishes nothing.
"""

from __future__ import annotations

import logging

from celery.signals import worker_process_init, worker_ready, worker_shutdown

log = logging.getLogger("holdfast.hosts")


def _install() -> None:
    from controlplane.hosts import publisher
    from controlplane.pool.pool import get_pool

    publisher.install(get_pool())


@worker_process_init.connect
def _on_process_init(**_: object) -> None:
    _install()


@worker_ready.connect
def _on_ready(sender=None, **_: object) -> None:
    from celery.concurrency.prefork import TaskPool as PreforkPool

    if isinstance(getattr(sender, "pool", None), PreforkPool):
        return
    _install()


@worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    from controlplane.hosts import publisher, snapshots

    try:
        snapshots.withdraw(publisher.worker_label())
    except Exception:  # the cache may be gone already; the TTL removes the key anyway
        log.warning("snapshot_withdraw_failed", exc_info=True)
