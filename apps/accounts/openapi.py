"""OpenAPI (drf-spectacular) glue: the token auth scheme, a paginated-list helper, and response
schemas for the plain APIViews of other apps that return hand-built dicts.

Imported from :class:`apps.accounts.apps.AccountsConfig.ready` so the extensions register.
The view extensions only *describe* the views (they subclass them with ``extend_schema``);
they do not change behaviour. An app that annotates its own view makes its entry here
unnecessary.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiViewExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers


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


_PAGINATED: dict[str, type[serializers.Serializer]] = {}


def paginated(serializer_class: type[serializers.Serializer], name: str | None = None) -> serializers.Serializer:
    """Schema of a LimitOffsetPagination page of ``serializer_class`` items."""
    name = name or f"Paginated{serializer_class.__name__.removesuffix('Out')}List"
    if name not in _PAGINATED:
        _PAGINATED[name] = type(name, (serializers.Serializer,), {
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializer_class(many=True),
        })
    return _PAGINATED[name]()


ERROR = OpenApiResponse(OpenApiTypes.OBJECT, description="field name → list of problems, or `detail`")


class ClusterTotalsOut(serializers.Serializer):
    gpus = serializers.IntegerField()
    gpus_allocated = serializers.FloatField()
    allocation = serializers.FloatField()
    nodes = serializers.IntegerField()
    nodes_alive = serializers.IntegerField()


class ClusterOut(serializers.Serializer):
    totals = ClusterTotalsOut()
    queue_depth = serializers.DictField(child=serializers.IntegerField())
    nodes = serializers.ListField(child=serializers.DictField())


class UsageOut(serializers.Serializer):
    user = serializers.CharField()
    me = serializers.DictField()
    teams = serializers.DictField(child=serializers.DictField())


class ClusterSchema(OpenApiViewExtension):
    target_class = "apps.cluster.api.ClusterView"

    def view_replacement(self):
        class Fixed(self.target_class):
            @extend_schema(responses=ClusterOut)
            def get(self, request, *args, **kwargs):
                return super().get(request, *args, **kwargs)

        return Fixed


class UsageSchema(OpenApiViewExtension):
    target_class = "apps.quotas.api.UsageView"

    def view_replacement(self):
        class Fixed(self.target_class):
            @extend_schema(responses=UsageOut)
            def get(self, request, *args, **kwargs):
                return super().get(request, *args, **kwargs)

        return Fixed


class ModelVersionOut(serializers.Serializer):
    id = serializers.IntegerField()
    team = serializers.CharField()
    name = serializers.CharField()
    version = serializers.IntegerField()
    job = serializers.UUIDField(allow_null=True)
    sha256 = serializers.CharField(allow_blank=True)
    size = serializers.IntegerField()
    metrics = serializers.DictField()
    created_at = serializers.DateTimeField()


class ModelListSchema(OpenApiViewExtension):
    target_class = "apps.registry.api.ModelListView"

    def view_replacement(self):
        class Fixed(self.target_class):
            @extend_schema(operation_id="models_list", responses=ModelVersionOut(many=True))
            def get(self, request, *args, **kwargs):
                return super().get(request, *args, **kwargs)

        return Fixed


class ModelDetailSchema(OpenApiViewExtension):
    target_class = "apps.registry.api.ModelDetailView"

    def view_replacement(self):
        class Fixed(self.target_class):
            @extend_schema(responses={200: ModelVersionOut, 404: ERROR})
            def get(self, request, *args, **kwargs):
                return super().get(request, *args, **kwargs)

        return Fixed


class ModelDownloadSchema(OpenApiViewExtension):
    target_class = "apps.registry.api.ModelDownloadView"

    def view_replacement(self):
        class Fixed(self.target_class):
            @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: ERROR},
                           parameters=[OpenApiParameter("pk", int, OpenApiParameter.PATH)])
            def get(self, request, *args, **kwargs):
                return super().get(request, *args, **kwargs)

        return Fixed
