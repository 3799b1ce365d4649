"""Downloads that resume: one byte range of a file (``Range: bytes=a-b``, ``bytes=a-``, ``bytes=-n``).

Django's ``FileResponse`` ignores ``Range``: a 200 with the whole file, so a 200 MB weights file
pulled over a flaky link started again from its first byte after every break (trial 32; page 32).
:func:`file_download` answers every download with ``Accept-Ranges: bytes``, and a single range
with a 206 and ``Content-Range``; a range that starts past the end is a 416 naming ``Range``, the
range asked and the file's size. The handle is whatever the view opened after its checks (a
local file, or :class:`apps.core.storage.StoredObjectReader` from an object store, which fetches
from the position it is sought to: no view redirects to the store), so authorization and the
sha256 check stay the view's, unchanged.

Gotchas, each deliberate:

- Several ranges (``bytes=0-1,5-9``), another unit, or a range that is no range (``bytes=9-2``,
  ``bytes=abc``) are ignored: a 200 with the whole file, as RFC 9110 allows (14.2) — a multipart
  body is something no download client here needs.
- ``If-Range`` is honoured only when it equals the ``ETag`` sent (the file's recorded sha256, so a
  strong validator); anything else (a date, another hash, no ETag to compare with) gets the whole
  file, never a piece of a file that may have changed since the part the client holds.
- The whole file's sha256 headers (``X-Weights-SHA256``) stay on a 206: the client checks its
  joined file against them.
"""

from __future__ import annotations

import io
import re
from typing import IO

from django.http import FileResponse, HttpRequest
from rest_framework import status
from rest_framework.response import Response

from .api import field_errors

RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")


class _Slice(io.RawIOBase):
    """``length`` bytes of ``handle`` from ``start``: what a 206 streams (FileResponse reads it
    block by block and closes it, which closes the file). No ``seek``/``tell``, so FileResponse
    does not size it: the view sets Content-Length itself."""

    def __init__(self, handle: IO[bytes], start: int, length: int) -> None:
        super().__init__()
        handle.seek(start)
        self._handle, self._left = handle, length

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        data = self._handle.read(self._left if size is None or size < 0 else min(size, self._left))
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._handle.close()
        super().close()


def wanted_range(request: HttpRequest, size: int, etag: str) -> tuple[int, int] | str | None:
    """The range asked for as (first byte, last byte), the words for a 416 when it cannot be
    served, or None for the whole file (no Range, one this module ignores, or a stale If-Range)."""
    header = request.headers.get("Range", "").strip()
    if not header:
        return None
    if "If-Range" in request.headers and (not etag or request.headers["If-Range"].strip() != etag):
        return None
    matched = RANGE.fullmatch(header.replace(" ", ""))
    if not matched or matched.group(1) == matched.group(2) == "":
        return None
    first, last = matched.groups()
    # A number past 30 digits is past any file's end (and int() of thousands of digits is refused).
    number = {text: int(text) if len(text) <= 30 else 10**30 for text in (first, last) if text}
    if first == "":  # the last n bytes
        if number[last] == 0:
            return f"{header[:60]} asks for no bytes: the file is {size} bytes"
        return (max(size - number[last], 0), size - 1) if size else f"{header[:60]} cannot be served: the file is empty"
    start = number[first]
    end = size - 1 if last == "" else number[last]
    if last != "" and end < start:
        return None  # no range at all (RFC 9110 14.1.1): ignored
    if start >= size:
        return (
            f"{header[:60]} starts past the end: the file is {size} bytes (bytes 0-{size - 1})"
            if size
            else f"{header[:60]} cannot be served: the file is empty"
        )
    return start, min(end, size - 1)


def file_download(
    request: HttpRequest,
    handle: IO[bytes],
    *,
    content_type: str,
    filename: str = "",
    as_attachment: bool = False,
    sha256: str = "",
) -> FileResponse | Response:
    """``FileResponse`` of ``handle`` (opened and checked by the view), resumable: the range the
    request asks for (206), or a 416 naming ``Range``; ``sha256`` (the recorded hash, when there
    is one) is sent as the ETag that ``If-Range`` is compared with."""
    etag = f'"{sha256}"' if sha256 else ""
    size = handle.seek(0, io.SEEK_END)
    handle.seek(0)
    wanted = wanted_range(request, size, etag)
    if isinstance(wanted, str):
        handle.close()
        response = field_errors({"Range": wanted}, status.HTTP_416_REQUESTED_RANGE_NOT_SATISFIABLE)
        response["Content-Range"] = f"bytes */{size}"
        response["Accept-Ranges"] = "bytes"
        return response
    if wanted is None:
        response = FileResponse(handle, as_attachment=as_attachment, filename=filename, content_type=content_type)
    else:
        start, end = wanted
        response = FileResponse(
            _Slice(handle, start, end - start + 1),
            as_attachment=as_attachment,
            filename=filename,
            content_type=content_type,
        )
        response.status_code = status.HTTP_206_PARTIAL_CONTENT
        response["Content-Range"] = f"bytes {start}-{end}/{size}"
        response["Content-Length"] = str(end - start + 1)
    response["Accept-Ranges"] = "bytes"
    if etag:
        response["ETag"] = etag
    return response
