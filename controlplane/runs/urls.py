"""The runner's internal HTTP API (see docs/runner-api.md), mounted at /internal/runs/."""

from django.urls import path

from . import views

app_name = "runs"

urlpatterns = [
    path("<str:run_id>/hello", views.hello, name="hello"),
    path("<str:run_id>/bundle", views.bundle, name="bundle"),
    path("<str:run_id>/events", views.events, name="events"),
    path("<str:run_id>/result", views.result, name="result"),
    path("<str:run_id>/steer", views.steer, name="steer"),
]
