from django.contrib import admin, messages
from django.template.response import TemplateResponse

from controlplane.owners import keys
from controlplane.owners.models import ApiKey, Owner


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    can_delete = False
    fields = ("prefix", "label", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        # A key is made by the "create an API key" action, which shows it once.
        return False


@admin.register(Owner)
class OwnerAdmin(admin.ModelAdmin):
    list_display = ("name", "weight", "is_active", "max_active", "max_queued", "max_live_runs", "created_at")
    list_filter = ("is_active",)
    search_fields = ("name",)
    inlines = [ApiKeyInline]
    actions = ["create_api_key"]

    def get_readonly_fields(self, request, obj=None):
        # Executions and runs store the name: renaming would orphan their history.
        return ("name",) if obj is not None else ()

    @admin.action(description="Create an API key (shown once)")
    def create_api_key(self, request, queryset):
        created = [(owner, keys.create_key(owner, label=f"admin:{request.user}")[1]) for owner in queryset]
        # Rendered straight into this response, never into a message: messages are kept
        # in the session store or a cookie.
        return TemplateResponse(
            request,
            "owners/keys_created.html",
            {**self.admin_site.each_context(request), "title": "API keys created", "created": created},
        )


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "owner", "label", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "owner__name", "label")
    readonly_fields = ("id", "owner", "prefix", "created_at", "last_used_at", "revoked_at")
    exclude = ("digest",)
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset):
        count = sum(keys.revoke(key) for key in queryset)
        self.message_user(request, f"{count} key(s) revoked", messages.SUCCESS)
