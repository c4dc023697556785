"""The runner's internal HTTP API (see docs/runner-api.md)."""

urlpatterns: list = []
