from __future__ import annotations

from django.contrib import admin, messages
from django.urls import path

from controlplane.hosts import actions, views
from controlplane.hosts.models import SandboxHost


@admin.register(SandboxHost)
class SandboxHostAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "state",
        "isolation",
        "drained_by",
        "host_id",
        "address",
        "last_seen_at",
        "drain_started_at",
    )
    list_filter = ("state", "drained_by")
    search_fields = ("name", "host_id", "address")
    # State changes go through the actions (compare-and-set, logged), not free editing.
    readonly_fields = (
        "state",
        "isolation",
        "drained_by",
        "host_id",
        "drain_started_at",
        "last_seen_at",
        "created_at",
    )
    actions = ["drain_hosts", "mark_active"]
    change_list_template = "admin/hosts/sandboxhost/change_list.html"

    def get_urls(self):
        page = self.admin_site.admin_view(lambda request: views.drain_status(request, model_admin=self))
        return [path("drain-status/", page, name="hosts_sandboxhost_drain_status"), *super().get_urls()]

    @admin.action(description="Drain the selected hosts (operator drain)", permissions=["change"])
    def drain_hosts(self, request, queryset) -> None:
        changed = sum(actions.drain(row) for row in queryset)
        self.message_user(request, f"{changed} host(s) now draining.", messages.SUCCESS)

    @admin.action(description="Mark the selected hosts active (end their drain)", permissions=["change"])
    def mark_active(self, request, queryset) -> None:
        changed = sum(actions.activate(row, reason=f"operator {request.user.get_username()}") for row in queryset)
        self.message_user(request, f"{changed} host(s) marked active.", messages.SUCCESS)
