"""Pages for list endpoints: ``?limit=&offset=`` (DRF's LimitOffsetPagination), bounded and strict.

Without ``max_limit`` one request could ask for every row of a 100k-job table. DRF reads
a bad ``limit`` as the default, cuts one over the maximum down to it, reads a bad
``offset`` as 0; and ``?page=`` (another pagination style's name) is simply ignored. A
new-user trial took each of these for a page that worked, so here every one is a 400 naming
the parameter and the problem. An offset past the end is an empty page, as in DRF.
"""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

from .values import ascii_int

# Parameters of other pagination styles (DRF's page numbers and cursors, common habits).
OTHER_STYLES = ("page", "page_size", "per_page", "cursor")


class ListPage(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    @classmethod
    def other_style(cls) -> str:
        """What a list says of another pagination style's parameter (``?page=``)."""
        return (f"is not a parameter of this list: it is paged with ?limit= (1 to {cls.max_limit}, "
                f"default {cls.default_limit}) and ?offset= (items to skip)")

    def paginate_queryset(self, queryset, request, view=None):
        for name in OTHER_STYLES:
            if name in request.query_params:
                raise ValidationError({name: [self.other_style()]})
        # An offset past the end stays an empty page (``count`` says how long the list is): a
        # client paging through a list that shrinks meanwhile (queued jobs start) must not fail.
        return super().paginate_queryset(queryset, request, view)

    def get_limit(self, request) -> int:
        raw = request.query_params.get(self.limit_query_param, "")
        if raw == "":
            return self.default_limit
        try:
            limit = ascii_int(raw)
        except ValueError:
            limit = 0
        if limit < 1:
            raise ValidationError({"limit": [f"must be a positive integer, got {raw[:50]!r}"]})
        if limit > self.max_limit:
            raise ValidationError({"limit": [f"must be at most {self.max_limit}, got {limit}"]})
        return limit

    def get_offset(self, request) -> int:
        raw = request.query_params.get(self.offset_query_param, "")
        if raw == "":
            return 0
        try:
            offset = ascii_int(raw)
        except ValueError:
            offset = -1
        if offset < 0:
            raise ValidationError({"offset": [f"must be 0 or a positive integer, got {raw[:50]!r}"]})
        return offset
