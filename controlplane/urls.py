"""URL map: the admin and the runner's internal API."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("internal/runs/", include("controlplane.runs.urls")),
]
