"""Deploy checks (``manage.py check --deploy``, which the Procfile's web line runs with
``--fail-level WARNING``): a production deploy does not start with settings that let
code run outside the full sandbox."""

from __future__ import annotations

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def required_isolation_is_full(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    if settings.SANDBOX_REQUIRED_ISOLATION == settings.SANDBOX_FULL_ISOLATION:
        return []
    return [
        checks.Warning(
            f"HOLDFAST_REQUIRED_ISOLATION={settings.SANDBOX_REQUIRED_ISOLATION} lets the pool and the launch "
            f"driver send untrusted code to hosts without the full sandbox ({settings.SANDBOX_FULL_ISOLATION}).",
            hint="Unset it in production; lower it only on a developer machine (docs/operations.md).",
            id="holdfast.W001",
        )
    ]
