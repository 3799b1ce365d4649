"""OpenAPI (drf-spectacular) description of this app's token authentication.

Imported from :class:`apps.accounts.apps.AccountsConfig.ready` so the extension registers.
The shared helpers (``paginated``, ``ERROR``) live in :mod:`apps.core.openapi`; each app
describes its own views with ``extend_schema`` beside them.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class HashedTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.accounts.auth.HashedTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>`; create keys at /api/v1/tokens/ or with `manage.py issue_token`.",
        }
