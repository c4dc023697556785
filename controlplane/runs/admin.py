"""Admin pages for runs, their events and receipts: read-only where it matters.

Secrets, key hashes and the token salt are never displayed: every page lists its fields
explicitly instead of falling back to "all fields".
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import actions
from .models import Receipt, Run, RunEvent, RunNotification, SteerMessage
from .receipts import verify_receipt
from .steer_admin import SteerMessageAdmin, SteerMessageInline

RUN_FIELDS = (
    "id",
    "owner",
    "status",
    "job",
    "host_id",
    "instance_id",
    "key_revoked_at",
    "exit_code",
    "error",
    "summary",
    "sandbox_ref",
    "loss_observed_at",
    "relaunched_at",
    "callback_url",
    "created_at",
    "provisioned_at",
    "started_at",
    "finished_at",
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "owner", "status", "exit_code", "created_at", "finished_at")
    list_filter = ("status", "owner")
    search_fields = ("id", "owner")
    fields = RUN_FIELDS
    readonly_fields = RUN_FIELDS
    actions = ("cancel_selected",)
    inlines = (SteerMessageInline,)

    @admin.action(description="Cancel selected runs")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        cancelled = sum(actions.cancel_run(run.id, "cancelled from the admin") for run in queryset)
        self.message_user(request, f"{cancelled} run(s) cancelled", messages.SUCCESS)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # The change list needs it for the cancel action; every field stays read-only.
        return super(ReadOnlyAdmin, self).has_change_permission(request, obj)

    def save_formset(self, request, form, formset, change):  # type: ignore[no-untyped-def]
        if formset.model is SteerMessage:
            return SteerMessageInline.send_new(request, formset, self)
        return super().save_formset(request, form, formset, change)


admin.site.register(SteerMessage, SteerMessageAdmin)


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ("run", "seq", "type", "ts")
    list_filter = ("type",)
    search_fields = ("run__id",)
    fields = ("run", "seq", "type", "data", "ts", "batch_key")
    readonly_fields = fields
    list_select_related = ("run",)


@admin.register(RunNotification)
class RunNotificationAdmin(ReadOnlyAdmin):
    list_display = ("run", "status", "attempts", "delivered_at", "abandoned_at", "last_error")
    list_filter = ("status",)
    search_fields = ("run__id",)
    fields = ("run", "status", "url", "attempts", "lease_until", "delivered_at", "abandoned_at", "last_error")
    readonly_fields = fields
    list_select_related = ("run",)


@admin.register(Receipt)
class ReceiptAdmin(ReadOnlyAdmin):
    list_display = ("run", "owner", "chain_index", "sha256", "verified")
    list_filter = ("owner",)
    search_fields = ("run__id", "sha256", "owner")
    fields = ("run", "owner", "chain_index", "payload", "payload_sha256", "previous_sha256", "sha256", "created_at")
    readonly_fields = fields

    @admin.display(boolean=True)
    def verified(self, obj: Receipt) -> bool:
        return verify_receipt(obj).ok
