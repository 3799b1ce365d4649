"""What the upload views (datasets, weights) share: the input checks before a file is
stored, and the answers when the store refuses it."""
from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response

from apps.core.api import field_errors
from apps.core.errors import FieldErrors
from apps.core.storage import StorageUnavailable

from .selectors import team_for_upload
from .services import StorageQuotaExceeded


class UploadRefused(Exception):
    """The answer to give instead of storing the upload."""

    def __init__(self, response: Response):
        super().__init__(response.data)
        self.response = response


def upload_input(request, serializer_class, limit: int):
    """The validated input of a multipart upload and the team it goes to.

    Raises UploadRefused (400 naming the field) for a declared size past `limit` or an
    unknown/ambiguous team; invalid fields raise DRF's ValidationError as usual. Under
    ASGI, bodies past the limit (+ multipart slack) never get here: yoloportal/body_limit.py
    answers 413 before reading them. The size check is for WSGI."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > limit + 1024**2:
        raise UploadRefused(field_errors({"file": f"the upload is {int(declared)} bytes; the limit is {limit} bytes"}))
    data = serializer_class(data=request.data)
    data.is_valid(raise_exception=True)
    values = data.validated_data
    try:
        team = team_for_upload(user=request.user, slug=values.get("team"))
    except FieldErrors as exc:
        raise UploadRefused(field_errors(exc.errors)) from exc
    return values, team


def storage_refusal(exc: Exception, what: str) -> Response:
    """The answer for a store that refused `what` ("the dataset was", "the weights were"):
    400 past the team's storage quota, 503 while the store cannot be reached."""
    if isinstance(exc, StorageQuotaExceeded):
        return field_errors({"file": str(exc)})
    assert isinstance(exc, StorageUnavailable), exc
    return Response({"file": [f"The artifact storage cannot be reached right now, so {what} not stored "
                              "(no version was made); try again in a minute."]},
                    status=status.HTTP_503_SERVICE_UNAVAILABLE)


STORE_REFUSALS = (StorageQuotaExceeded, StorageUnavailable)
