"""Path converters of every URLconf, registered once (``CoreConfig.ready``)."""

from __future__ import annotations

import uuid


class AnyCaseUUIDConverter:
    """``<any_uuid:job_id>``: a UUID in either case, as ``uuid.UUID`` reads one.

    Django's ``<any_uuid:…>`` matches lower case only: a client that upper-cases ids (a spreadsheet, a
    Windows tool, ``[guid]`` in PowerShell) got the generic "no API endpoint" 404 for its own job.
    The view receives a ``uuid.UUID``, so lookups, team scoping and links are as for a lower-case id.
    """

    regex = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

    def to_python(self, value: str) -> uuid.UUID:
        return uuid.UUID(value)

    def to_url(self, value: uuid.UUID | str) -> str:
        return str(value).lower()
