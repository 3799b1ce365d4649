"""Which audit entries an admin page may show the viewer: those the audit log's own admin lists
for them (a manager: their teams' entries; a superuser: all)."""

from __future__ import annotations

from django.db.models import QuerySet

from .models import AuditEntry


def visible_entries(request, admin_site) -> QuerySet[AuditEntry]:
    audit_admin = admin_site._registry.get(AuditEntry)
    if audit_admin is None or not audit_admin.has_view_permission(request):
        return AuditEntry.objects.none()
    return audit_admin.get_queryset(request)
