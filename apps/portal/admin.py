"""The RQ dashboard is for admins only: its queues hold every team's jobs.

django-rq registers it for any staff user (and team managers are staff here), so it is
registered again with superuser-only checks, views included.
"""

from __future__ import annotations

from django.contrib import admin
from django_rq import models as rq_models
from django_rq.admin import QueueAdmin

from apps.core.admin_scoping import superuser_required

RQ_SUPERUSERS_ONLY = "superusers only: the RQ dashboard shows every team's queued work"


class SuperuserQueueAdmin(QueueAdmin):
    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_change_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def get_urls(self):
        urls = super().get_urls()
        for pattern in urls:
            pattern.callback = superuser_required(pattern.callback, why=RQ_SUPERUSERS_ONLY)
        return urls


if admin.site.is_registered(rq_models.Dashboard):
    admin.site.unregister(rq_models.Dashboard)
    admin.site.register(rq_models.Dashboard, SuperuserQueueAdmin)
