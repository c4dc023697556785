"""The public API's URL map, mounted at /api/v1/ by the ``all`` web role only
(controlplane/urls.py), never by ``runner-api``: a run's relay reaches that process, and
a job must not find the public API (or anything else) there."""

from django.urls import path, re_path

from . import executions_views, meta_views, runs_views

app_name = "api"

urlpatterns = [
    path("executions", executions_views.create, name="executions"),
    path("executions/<str:execution_id>", executions_views.detail, name="execution"),
    path("executions/<str:execution_id>/cancel", executions_views.cancel, name="execution-cancel"),
    path("runs", runs_views.create, name="runs"),
    path("runs/<str:run_id>", runs_views.detail, name="run"),
    path("runs/<str:run_id>/cancel", runs_views.cancel, name="run-cancel"),
    path("runs/<str:run_id>/events", runs_views.events, name="run-events"),
    path("runs/<str:run_id>/events/stream", runs_views.events_stream, name="run-events-stream"),
    path("runs/<str:run_id>/messages", runs_views.messages, name="run-messages"),
    path("openapi.json", meta_views.openapi, name="openapi"),
    # Anything else under /api/v1/ is a JSON 404, not Django's HTML page.
    re_path(r"^.*$", meta_views.not_found),
]
