"""Views that only a page's button reaches (POST): opened by a link or the address bar, they say so.

Django's ``require_POST`` answered a blank 405 page, with no layout and no words (manager trial 15,
F18). :func:`button_only` answers the same status with a short page that names what to do and links
back to the page that has the button.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.shortcuts import render
from django.urls import reverse


def button_only(back: str, *, kwarg: str | None = None) -> Callable:
    """Let only POST through; any other method gets a 405 page linking to ``back`` (a URL name,
    reversed with the view's ``kwarg`` when given: the object's page)."""

    def decorator(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapped(request, *args, **kwargs):
            if request.method == "POST":
                return view(request, *args, **kwargs)
            back_url = reverse(back, kwargs={kwarg: kwargs[kwarg]} if kwarg else None)
            response = render(request, "405.html", {"back_url": back_url}, status=405)
            response["Allow"] = "POST"
            return response

        return wrapped

    return decorator
