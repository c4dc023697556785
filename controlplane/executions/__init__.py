"""Executions: a snippet in; stdout, stderr, exit status and duration out.

``execute`` and ``submit`` are the public API. They are imported lazily so importing
this package never touches Django's app registry.
"""

from __future__ import annotations

from typing import Any


def execute(code: str, **kwargs: Any):
    from controlplane.executions.api import execute as _execute

    return _execute(code, **kwargs)


def submit(code: str, **kwargs: Any):
    from controlplane.executions.api import submit as _submit

    return _submit(code, **kwargs)


def cancel(execution_id: str) -> str:
    from controlplane.executions.api import cancel as _cancel

    return _cancel(execution_id)
