"""OpenAPI (drf-spectacular) helpers every app's API uses: a paginated-list schema and the error body.

Each app describes its own views with ``extend_schema`` next to them; the token auth
scheme is described by ``apps.accounts.openapi`` beside the class it documents.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
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


def page_parameters(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: every operation that answers a :func:`paginated`
    page takes ``limit`` and ``offset`` (apps.core.pagination.ListPage), said once here rather
    than beside each view; ``GET schema/`` listed only ``action, after, team`` for ``audit/``,
    whose 400 names limit and offset among what it takes (manager trial 15, F26)."""
    from .pagination import ListPage

    page = [
        {"in": "query", "name": "limit", "required": False, "schema": {"type": "integer", "minimum": 1,
                                                                       "maximum": ListPage.max_limit},
         "description": f"items per page (default {ListPage.default_limit})"},
        {"in": "query", "name": "offset", "required": False, "schema": {"type": "integer", "minimum": 0},
         "description": "items to skip (past the end: an empty page)"},
    ]
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            schema = (operation.get("responses", {}).get("200", {}).get("content", {})
                      .get("application/json", {}).get("schema", {}))
            if not schema.get("$ref", "").rsplit("/", 1)[-1].startswith("Paginated"):
                continue
            parameters = operation.setdefault("parameters", [])
            named = {(p.get("in"), p.get("name")) for p in parameters}
            parameters.extend(p for p in page if ("query", p["name"]) not in named)
            parameters.sort(key=lambda p: (p.get("in", ""), p.get("name", "")))
    return result


def query_errors(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: every GET answers a query parameter it does not take
    with a 400 naming it (:func:`apps.core.api.query_strict`, called first thing in each one), so
    every GET documents that 400; detail GETs showed only 200 and 404. Said once here, like
    :func:`page_parameters`, rather than beside each of ~30 views (the schema view itself is not strict)."""
    for path, operations in result.get("paths", {}).items():
        operation = operations.get("get")
        if operation is None or path.endswith("/schema/"):
            continue
        operation.setdefault("responses", {}).setdefault("400", {
            "content": {"application/json": {"schema": {"type": "object", "additionalProperties": {}}}},
            "description": "a query parameter it does not take (or a value it cannot filter by): its name "
                           "→ list of problems, e.g. {\"foo\": [\"is not a parameter of a job (it takes no "
                           "parameters)\"]}",
        })
        operation["responses"] = dict(sorted(operation["responses"].items()))
    return result


ERROR = OpenApiResponse(OpenApiTypes.OBJECT, description="field name → list of problems, or `detail`")


def retry_after(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: every documented 429 declares the ``Retry-After`` header
    (seconds) it is sent with (the throttles', the active-job cap's): a client generated from the
    schema had no word of when to try again (trial 32). Said once here, like :func:`query_errors`."""
    header = {"Retry-After": {"schema": {"type": "integer"},
                              "description": "seconds to wait before trying again"}}
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            refused = operation.get("responses", {}).get("429")
            if refused is not None:
                refused.setdefault("headers", {}).update(header)
    return result


def before_parameter(items: str) -> OpenApiParameter:
    """The ``before`` query parameter of a list paged by :class:`apps.core.pagination.NewestFirstPage`."""
    return OpenApiParameter("before", str, description=(
        f"the {items} listed after this one (its id): what a `next` link carries, so that {items} added or "
        "removed between two pages neither repeat nor hide any; not with offset"))


# A resumable download (apps.core.downloads.file_download): its Range header and the answers it adds.
RANGE_HEADER = OpenApiParameter("Range", str, OpenApiParameter.HEADER, description=(
    "one byte range: bytes=a-b, bytes=a- or bytes=-n (the last n); answered 206 with Content-Range. Several "
    "ranges, or one that is no range, get the whole file (200); one starting past the end a 416 naming Range "
    "and the file's size. Every download says Accept-Ranges: bytes; with If-Range (the ETag, a quoted sha256) "
    "a file that changed since comes whole"))
RANGE_RESPONSES = {(206, "application/octet-stream"): OpenApiResponse(
    OpenApiTypes.BINARY, description="the range asked for (Content-Range: bytes a-b/size)"),
    416: OpenApiResponse(OpenApiTypes.OBJECT, description="{\"Range\": [the range asked, and the file's size]}; "
                                                          "Content-Range: bytes */size")}
