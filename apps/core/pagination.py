"""Pages for list endpoints: ``?limit=&offset=`` (DRF's LimitOffsetPagination), bounded and strict.

Without ``max_limit`` one request could ask for every row of a 100k-job table. DRF reads
a bad ``limit`` as the default, cuts one over the maximum down to it, reads a bad
``offset`` as 0; and ``?page=`` (another pagination style's name) is simply ignored. A
new-user trial took each of these for a page that worked, so here every one is a 400 naming
the parameter and the problem. An offset past the end is an empty page, as in DRF.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.utils.urls import remove_query_param, replace_query_param

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


# models/ and datasets/: a team's names in order, each name's newest version first (their models'
# Meta ordering, unique on (team, name, version)), the id last as in every keyset ordering.
VERSION_ORDER = ("team__slug", "name", "-version", "-pk")


class NewestFirstPage(ListPage):
    """Pages of a list whose ``next`` link carries on after the last item shown (``?before=<its
    id>``) rather than at an offset: newest first (jobs/, audit/, notifications/deliveries/,
    tokens/), or another fixed order given as ``ordering`` (models/ and datasets/: by team, name,
    newest version first).

    An offset counts from the list's head as it is when the next page is read: jobs submitted
    between two pages pushed the ones already shown onto the next page again, and jobs leaving a
    filtered list (``?state=queued`` ones starting) pulled unseen ones back before the offset, so
    a script paging through its jobs read some twice and never saw others (trial 32; the same on
    models/ when a version was registered between two pages, page 32). After an item, each
    remaining one comes once. ``?offset=`` still jumps into the list (not with ``before``);
    ``count`` is the whole list's as it is now; a page reached with ``before`` has no
    ``previous`` link. The view passes ``cursor_scope``: where the ``before`` item is looked up
    (every item the caller may see, unfiltered, so an item that has left the filter still
    places the page; another team's item is "no such item", never a leak), and what to say when
    it is not there.

    ``ordering`` must end in a unique key (``pk``) and hold no nullable field: the keyset
    condition compares each field's value with the ``before`` item's (``queue/`` cannot page
    this way: its positions move every scheduler pass).
    """

    cursor_query_param = "before"
    ordering = ("-created_at", "-pk")

    def __init__(self, *, item: str = "job", ordering: tuple[str, ...] | None = None) -> None:
        self.item = item
        if ordering is not None:
            self.ordering = ordering

    def paginate_queryset(self, queryset, request, view=None, *, cursor_scope=None, not_found: str = ""):
        queryset = queryset.order_by(*self.ordering)
        self.last = None
        raw = request.query_params.get(self.cursor_query_param)
        if raw is None:
            page = super().paginate_queryset(queryset, request, view)
            self.last = page[-1] if page else None
            return page
        for name in OTHER_STYLES:
            if name in request.query_params:
                raise ValidationError({name: [self.other_style()]})
        if request.query_params.get(self.offset_query_param, "") not in ("", "0"):
            raise ValidationError({self.offset_query_param: [
                f"cannot be given with {self.cursor_query_param}= (a next link's cursor): give one of the two"]})
        cursor = self.cursor_get(raw, queryset if cursor_scope is None else cursor_scope, not_found)
        self.request, self.limit, self.offset = request, self.get_limit(request), 0
        self.count = self.get_count(queryset)
        rows = list(queryset.filter(self.after(cursor))[:self.limit + 1])
        self.more, page = len(rows) > self.limit, rows[:self.limit]
        self.last = page[-1] if page else None
        return page

    def after(self, cursor: dict) -> Q:
        """The rows after ``cursor`` (its values of the ordering's fields) in ``ordering``:
        ``a < x or (a = x and (b < y or …))`` for descending fields, ``>`` for ascending ones."""
        condition = None
        for field in reversed(self.ordering):
            name = field.lstrip("-")
            beyond = Q(**{f"{name}__{'lt' if field.startswith('-') else 'gt'}": cursor[name]})
            condition = beyond if condition is None else beyond | (Q(**{name: cursor[name]}) & condition)
        return condition

    def cursor_get(self, raw: str, scope, not_found: str) -> dict:
        name = self.cursor_query_param
        article = "an" if self.item[0] in "aeiou" else "a"
        malformed = ValidationError({name: [f"must be {article} {self.item} id (as a next link gives it), "
                                            f"got {raw[:50]!r}"]})
        field = scope.model._meta.pk
        if field.get_internal_type() in ("AutoField", "BigAutoField"):
            # Digits only, and within a signed 64-bit integer: a longer number reached SQLite as an
            # OverflowError (a 500) and fullwidth digits were read as digits (apps.core.values).
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > 2**63 - 1:
                raise malformed
        try:
            pk = field.to_python(raw)
        except DjangoValidationError:
            raise malformed from None
        fields = [f.lstrip("-") for f in self.ordering]
        cursor = scope.select_related(None).filter(pk=pk).order_by().values(*fields).first()
        if cursor is None:
            raise ValidationError({name: [not_found or f"no {self.item} with that id in this list"]})
        return cursor

    def get_next_link(self):
        more = self.more if self.cursor_used else self.offset + self.limit < self.count
        if not more or self.last is None:
            return None
        url = remove_query_param(self.request.build_absolute_uri(), self.offset_query_param)
        return replace_query_param(url, self.cursor_query_param, str(self.last.pk))

    def get_previous_link(self):
        return None if self.cursor_used else super().get_previous_link()

    @property
    def cursor_used(self) -> bool:
        return self.cursor_query_param in self.request.query_params
