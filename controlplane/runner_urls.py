"""URL map of a web process that serves the runner's internal API and nothing else
(``HOLDFAST_WEB_ROLE=runner-api``).

A run's sandbox reaches the control plane through its relay, which carries bytes to
one address and cannot look inside them (TLS passes through it end to end). So what a
job can reach is whatever that address serves: point ``HOLDFAST_CONTROL_PLANE_URL`` at
a process with this map, and a job finds the runner API there, not the admin's login
page or anything else of the control plane.
"""

from django.urls import include, path

urlpatterns = [
    path("internal/runs/", include("controlplane.runs.urls")),
]
