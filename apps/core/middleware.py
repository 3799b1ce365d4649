"""Request checks every view relies on."""

from __future__ import annotations

from django.http import JsonResponse

NUL = "\x00"


def nul_refusal(given) -> JsonResponse | None:
    """A 400 naming the first parameter whose name or value holds a NUL character, else None."""
    for name, values in given.lists():
        if NUL in name or any(NUL in value for value in values):
            field = name.replace(NUL, "\\x00")
            return JsonResponse({field: ["must not contain a NUL character"]}, status=400)
    return None


class QueryNulMiddleware:
    """A query parameter, or a field of a portal or admin form, holding a NUL character is a 400
    naming it, for every view.

    PostgreSQL stores no NUL in text, so such a value reaching a filter was a 500 there (SQLite
    answered an empty list), and so was a form's text that a view stored as typed (a notification
    channel's name, a submit's idempotency key: trial28 F3; SQLite stored them).

    Form bodies are read where CSRF protection reads them anyway (views that are not
    ``csrf_exempt``): parsing an API upload here would parse it early, and the API's bodies are
    checked where they are parsed (DRF's fields and the spec parser refuse NUL)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return nul_refusal(request.GET) or self.get_response(request)

    def process_view(self, request, callback, callback_args, callback_kwargs):
        if request.method != "POST" or getattr(callback, "csrf_exempt", False):
            return None
        return nul_refusal(request.POST)
