"""Holdfast's control plane: the Django project, its apps and the Celery app."""

from controlplane.celery import app as celery_app

__all__ = ("celery_app",)
