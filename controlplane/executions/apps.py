import logging

from django.apps import AppConfig

from holdfast_wire.logfmt import fields


class ExecutionsConfig(AppConfig):
    name = "controlplane.executions"
    verbose_name = "Executions"

    def ready(self) -> None:
        from django.conf import settings

        # Settings that fell back to a default (settings.STARTUP_WARNINGS): said once
        # more through logging, which did not exist yet when settings.py ran.
        for message in getattr(settings, "STARTUP_WARNINGS", []):
            logging.getLogger("holdfast.settings").error("setting_fell_back", extra=fields(message=message))
