"""Request checks every view relies on."""

from __future__ import annotations

from django.http import JsonResponse

NUL = "\x00"


class QueryNulMiddleware:
    """A query parameter holding a NUL character is a 400 naming it, for every view.

    PostgreSQL stores no NUL in text, so such a value reaching a filter was a 500 there
    (SQLite answered an empty list). Bodies are checked where they are parsed (the spec
    parser refuses NUL); reading them here would parse uploads early."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        for name, values in request.GET.lists():
            if NUL in name or any(NUL in value for value in values):
                field = name.replace(NUL, "\\x00")
                return JsonResponse({field: ["must not contain a NUL character"]}, status=400)
        return self.get_response(request)
