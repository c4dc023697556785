from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "controlplane.runs"
    verbose_name = "Runs"
