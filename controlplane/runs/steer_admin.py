"""Steering in the admin: a run's messages listed on its page, new ones sent from it.

Sent messages are never editable: existing rows render read-only (no change permission),
and a new row is not saved by the admin but handed to ``steering.send``, which refuses a
terminal run and wakes the run's parked poll. The message list is read-only too.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest

from . import steering
from .errors import RunsError, RunTerminal
from .models import SteerMessage

FIELDS = ("id", "kind", "body", "created_at", "delivered_at", "attempts", "ended", "ended_at")


class SteerMessageInline(admin.TabularInline):
    model = SteerMessage
    fields = ("kind", "body", "created_at", "delivered_at", "attempts", "ended")
    readonly_fields = ("created_at", "delivered_at", "attempts", "ended")
    extra = 1
    can_delete = False
    verbose_name = "steering message or interrupt"
    verbose_name_plural = "Steering (send a message or an interrupt: fill the empty row and save)"

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Nothing can be sent to a run that has ended.
        return obj is not None and not getattr(obj, "is_terminal", True)

    @staticmethod
    def send_new(request: HttpRequest, formset, model_admin: admin.ModelAdmin) -> None:  # type: ignore[no-untyped-def]
        # The admin saves nothing itself (its change message reads these).
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for form in formset.extra_forms:
            if not form.has_changed():
                continue
            run = formset.instance
            kind, body = form.cleaned_data.get("kind"), form.cleaned_data.get("body") or ""
            try:
                sent = steering.send(run.id, kind, body)
            except RunTerminal as exc:
                model_admin.message_user(
                    request, f"Not sent: the run has already ended ({exc.status}).", messages.ERROR
                )
            except RunsError as exc:
                model_admin.message_user(request, f"Not sent: {exc.message}", messages.ERROR)
            else:
                model_admin.message_user(request, f"Sent {sent.kind} {sent.id}.", messages.SUCCESS)


class SteerMessageAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "kind", "created_at", "delivered_at", "attempts", "ended")
    list_filter = ("kind", "ended")
    search_fields = ("id", "run__id")
    fields = ("run", *FIELDS)
    readonly_fields = fields
    list_select_related = ("run",)

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
