"""The drain status page: HTML once, then the same view as JSON every few seconds.

Staff only (the admin site's ``admin_view`` wrapper sends anyone else to the login
page) and the ``view_sandboxhost`` permission (403 without it). Reads the cache and the
database only (``status.build``).
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse

from controlplane.hosts import status


def drain_status(request: HttpRequest, *, model_admin) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    data = status.build()
    table = render_to_string("hosts/_drain_table.html", {"data": data}, request=request)
    if request.GET.get("format") == "json":
        response = JsonResponse({**data, "html": table})
        response["Cache-Control"] = "no-store"
        return response
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Drain status",
        "opts": model_admin.model._meta,
        "data": data,
        "table": table,
    }
    return TemplateResponse(request, "hosts/drain_status.html", context)
