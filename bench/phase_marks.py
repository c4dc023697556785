"""Loaded only into ``bench/execute_phases.py``'s worker (``--include bench.phase_marks``):
writes a timestamp at each step of ``run_execution`` to ``HOLDFAST_BENCH_MARKS``, by
wrapping the functions the task calls. Benchmark instrumentation, never production."""

from __future__ import annotations

import functools
import os
import time

from celery.signals import task_postrun, task_prerun, task_received

from controlplane.executions import actions, dispatch, tasks
from controlplane.executions.enqueue import RUN_EXECUTION

_out = open(os.environ["HOLDFAST_BENCH_MARKS"], "a", buffering=1)


def mark(what: str) -> None:
    _out.write(f"{time.time():.6f} {what}\n")


@task_prerun.connect
def _prerun(task=None, **_kwargs) -> None:
    if task is not None and task.name == RUN_EXECUTION:
        mark("task started")


@task_received.connect
def _received(request=None, **_kwargs) -> None:
    # In the worker's consumer, before the pool's thread takes it: the hop's two halves.
    if request is not None and request.name == RUN_EXECUTION:
        mark("task received")


@task_postrun.connect
def _postrun(task=None, **_kwargs) -> None:
    if task is not None and task.name == RUN_EXECUTION:
        mark("task ended")


def _timed(module, name: str, label: str) -> None:
    inner = getattr(module, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        result = inner(*args, **kwargs)
        mark(label)
        return result

    setattr(module, name, wrapper)


_timed(dispatch, "claim_next", "claimed (fair dispatch)")
_timed(actions, "finish", "result stored, parked nudge back, notified")
_get_pool = tasks.get_pool


def _pool():
    pool = _get_pool()
    if not getattr(pool, "_bench_marked", False):
        run = pool.run

        def timed_run(*args, **kwargs):
            mark("code read, pool called")
            outcome = run(*args, **kwargs)
            mark("host answered (pool)")
            return outcome

        pool.run, pool._bench_marked = timed_run, True
    return pool


tasks.get_pool = _pool
