"""Pages for list endpoints: ``?limit=&offset=`` (DRF's LimitOffsetPagination), bounded.

Without ``max_limit`` one request could ask for every row of a 100k-job table.
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class ListPage(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000
