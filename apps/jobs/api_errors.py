"""Error bodies for the API: every 4xx names the field and the problem."""

from __future__ import annotations

from rest_framework import status
from rest_framework.exceptions import ErrorDetail
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if response.status_code == status.HTTP_404_NOT_FOUND and isinstance(response.data, dict):
        response.data.setdefault("detail", "Not found.")
    return response


def field_errors(errors: dict[str, str], http_status: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({key: [ErrorDetail(message, code="invalid")] for key, message in errors.items()},
                    status=http_status)
