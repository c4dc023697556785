from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "controlplane.api"
    label = "api"
    verbose_name = "Public API"
    default_auto_field = "django.db.models.BigAutoField"
