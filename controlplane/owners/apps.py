from django.apps import AppConfig


class OwnersConfig(AppConfig):
    name = "controlplane.owners"
    label = "owners"
    default_auto_field = "django.db.models.BigAutoField"
