from django.contrib import admin

from controlplane.executions.models import Execution


@admin.register(Execution)
class ExecutionAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "status", "exit_code", "host_id", "attempts", "duration_ms", "created_at")
    list_filter = ("status", "host_id", "created_at")
    search_fields = ("id", "owner", "host_id")
    date_hierarchy = "created_at"
    # What ran is history: the admin shows it, never rewrites it.
    readonly_fields = [f.name for f in Execution._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
