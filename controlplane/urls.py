"""URL map of the ``all`` web role: the admin, the runner's internal API and the public
API (/api/v1/, docs/api.md)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("internal/runs/", include("controlplane.runs.urls")),
    path("api/v1/", include("controlplane.api.urls")),
]
