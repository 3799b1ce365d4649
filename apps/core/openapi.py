"""OpenAPI (drf-spectacular) helpers every app's API uses: a paginated-list schema and the error body.

Each app describes its own views with ``extend_schema`` next to them; the token auth
scheme is described by ``apps.accounts.openapi`` beside the class it documents.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

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
