"""Django's admin app with the project's audited admin site as its default site.

Kept apart from ``admin_audit`` because ``INSTALLED_APPS`` imports it before models load.
"""

from django.contrib.admin.apps import AdminConfig


class AuditedAdminConfig(AdminConfig):
    default_site = "apps.accounts.admin_audit.AuditedAdminSite"
