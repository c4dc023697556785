from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "controlplane.hosts"
    verbose_name = "Sandbox hosts"

    def ready(self) -> None:
        # Connects the Celery worker signals that install the snapshot publisher. Only a
        # worker process sends them; web and command processes are unaffected.
        from controlplane.hosts import checks, worker_signals  # noqa: F401
