from django.apps import AppConfig


class ExecutionsConfig(AppConfig):
    name = "controlplane.executions"
    verbose_name = "Executions"
